"""The collector held back while thunder compiles and a region builds its plan
(``patches/compile_gc.py``): raised for exactly those windows, restored after them, after a
tracing error too, and left alone by the calls that follow."""

import gc

import pytest
import thunder
import torch

import thunder_fuser  # noqa: F401  (installs the hooks)
from thunder_fuser import fuser_ex
from thunder_fuser.patches import compile_gc


@pytest.fixture
def thresholds(monkeypatch):
    """Every threshold the collector is given, in order."""
    seen = []
    real = gc.set_threshold

    def record(*t):
        seen.append(t)
        real(*t)

    monkeypatch.setattr(compile_gc.gc, "set_threshold", record)
    return seen


def _f(x, y):
    return (x * y).sin().sum(-1) + y.exp().mean()


def test_installed_on_thunder_0_2_6():
    assert hasattr(thunder.thunder_general_jit, "thunder_fuser_original")
    assert issubclass(thunder.CacheEntry, thunder.CacheEntry.thunder_fuser_original)
    assert compile_gc.hold_gc_while_compiling()  # a second call changes nothing
    assert not hasattr(thunder.thunder_general_jit.thunder_fuser_original, "thunder_fuser_original")


def test_raised_while_compiling_and_building_plans_then_restored(thresholds):
    before = gc.get_threshold()
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    jf = thunder.jit(_f, executors=[fuser_ex])
    torch.testing.assert_close(jf(x, y), _f(x, y))
    raised = (compile_gc.COMPILE_THRESHOLD, *before[1:])
    # thunder's compile, then the region's first call (its plan); each restored
    assert thresholds == [raised, before, raised, before]
    assert gc.get_threshold() == before
    thresholds.clear()
    for _ in range(2):
        torch.testing.assert_close(jf(x, y), _f(x, y))
    assert thresholds == []  # a compiled call leaves the collector alone


def test_restored_where_tracing_raises(thresholds):
    before = gc.get_threshold()

    def bad(x):
        return x + undefined_name  # noqa: F821

    with pytest.raises(NameError):
        thunder.jit(bad)(torch.randn(3))
    assert gc.get_threshold() == before
    assert thresholds[-1] == before


def test_switched_off_nothing_is_held(monkeypatch, thresholds):
    monkeypatch.setattr(compile_gc, "_ON", False)
    with compile_gc.held():
        pass
    assert thresholds == []
