"""What a process keeps as it meets new shapes and layouts: bounded (``config.py``:
``THUNDER_FUSER_MAX_TRACES``, ``THUNDER_FUSER_MAX_PLANS``, ``THUNDER_FUSER_MAX_KERNELS``)."""

from __future__ import annotations

import gc

import pytest
import thunder
import torch

from thunder_fuser import fuser_ex
from thunder_fuser.backends.cute import cache
from thunder_fuser.runtime.region_runner import RegionRunner, RespecializationWarning


def _live_runners() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is RegionRunner)


def test_two_hundred_lengths_keep_a_bounded_number_of_traces_and_regions(monkeypatch):
    """An evaluation of variable lengths: each length is a trace of thunder's (its shapes are
    checked by the prologue) with its own regions; only the newest few are kept."""
    monkeypatch.setenv("THUNDER_FUSER_MAX_TRACES", "4")
    jf = thunder.jit(lambda x: torch.tanh(x * 2.0) + 1.0, executors=[fuser_ex])
    before = _live_runners()
    counts = []
    for n in range(1, 201):
        x = torch.randn(n, 4)
        torch.testing.assert_close(jf(x), torch.tanh(x * 2.0) + 1.0)
        if n in (50, 200):
            counts.append((len(thunder.compile_stats(jf).interpreter_cache), _live_runners() - before))
    assert counts[0] == counts[1] and counts[1][0] == 4 and counts[1][1] <= 2 * 4, counts
    x = torch.randn(3, 4)  # a dropped length comes back: traced again, right
    torch.testing.assert_close(jf(x), torch.tanh(x * 2.0) + 1.0)


def test_a_region_keeps_its_most_recent_plans_and_warns_that_it_respecializes(monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_MAX_PLANS", "3")
    jf = thunder.jit(lambda x: x * 2.0 + 1.0, executors=[fuser_ex])
    base = torch.randn(2, 3, 4)
    layouts = [base.permute(*p).contiguous().permute(*[p.index(i) for i in range(3)])
               for p in ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))]
    with pytest.warns(RespecializationWarning, match="THUNDER_FUSER_MAX_PLANS"):
        for x in layouts + layouts:
            torch.testing.assert_close(jf(x), x * 2.0 + 1.0)
    (runner,) = [v for v in thunder.last_traces(jf)[-1].python_ctx().values() if isinstance(v, RegionRunner)]
    assert len(runner.plans) == 3


def test_the_kernels_kept_in_memory_are_the_most_recently_used(monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_MAX_KERNELS", "2")
    monkeypatch.setenv("THUNDER_FUSER_DISK_CACHE", "0")
    monkeypatch.setattr(cache, "_memory", type(cache._memory)())
    monkeypatch.setattr(cache, "_export", lambda *a: None)
    monkeypatch.setattr(cache, "direct_function", lambda compiled: compiled)
    built = []

    def build(name):
        built.append(name)
        return lambda: name

    for name in ("a", "b", "a", "c", "a", "b"):
        assert cache.get_or_compile(("k", name), lambda: build(name))() == name
    assert built == ["a", "b", "c", "b"] and len(cache._memory) == 2
