"""The whole-model contenders, one way for every harness (``models.py``, ``decode.py``,
``distributed.py``): a model or step function as each contender runs it. thunder with the
torch.compile executor gets thunder's ``sdpa_ex`` too, as thunder + fuser gets attention
beside it (``thunder_fuser.executors()``): each thunder contender at its best on a model.
The kernel suite (``run.py``) compares single regions and keeps its own, with ``fuser_ex``
alone."""

from __future__ import annotations

import contextlib
import os

import torch

import thunder_fuser  # noqa: F401  (torch compat stubs before thunder)
import thunder


def thunder_executors(kind: str) -> list | None:
    """The executors of a thunder contender (``None``: thunder's defaults)."""
    if kind.startswith("thunder+torchcompile"):
        from thunder.executors.sdpaex import sdpa_ex
        from thunder.executors.torch_compile import torch_compile_ex

        return [sdpa_ex, torch_compile_ex]
    if kind.startswith("thunder+fuser"):
        return thunder_fuser.executors()
    return None


def thunder_transforms(kind: str) -> list | None:
    """The transforms of a thunder contender: thunder + fuser's (``thunder_fuser.transforms()``,
    as the README recommends, launch runs included; ``... no-launch-runs``: without
    ``LaunchRuns``), none for the others."""
    if not kind.startswith("thunder+fuser"):
        return None
    return thunder_fuser.transforms(launch_runs=False if kind.endswith("no-launch-runs") else None)


def thunder_functions(fn) -> list:
    """The ``thunder.jit`` functions a contender runs: itself (or the one it wraps), or for
    ThunderFX each piece of Dynamo's graphs that thunder took."""
    backend = getattr(fn, "thunderfx_backend", None)
    if backend is not None:
        return [f for info in backend.subgraph_infos for f in info.thunder_compiled_fns]
    return [getattr(fn, "jitted", fn)]


def run_label(kind: str, taken) -> str:
    """``kind``, or ``kind #2``, ``#3``... where ``taken`` holds a run of it already (an order
    test runs a contender again; each run keeps its own results)."""
    label, n = kind, 1
    while label in taken:
        n += 1
        label = f"{kind} #{n}"
    return label


def wrap(kind: str, fn):
    """``fn`` as contender ``kind`` runs it: eager, torch.compile (``... reduce-overhead``:
    with its CUDA graphs), thunder, thunderfx+fuser (``torch.compile`` with thunder's
    backend and our executors), thunder+torchcompile, thunder+fuser (``... graphed``:
    replayed by ``thunder_fuser.graphed``; ``... no-region-graphs``: each region's launches
    made plainly, not replayed as a graph; ``... no-launch-runs``: region calls and the
    matmuls between them not replayed as one graph, ``thunder_transforms/launch_runs.py``;
    ``... no-recompute``: with ``THUNDER_FUSER_RECOMPUTE=0``; ``... no-gqa`` and ``... gqa``:
    ``THUNDER_FUSER_GQA`` at ``0`` and ``1``, grouped-query K/V expanded before attention or
    read at their own heads on CUDA too, ``passes/grouped_query_attention.py``)."""
    if kind == "eager":
        return fn
    if kind == "torch.compile":
        return torch.compile(fn)
    if kind == "torch.compile reduce-overhead":
        return torch.compile(fn, mode="reduce-overhead")
    if kind == "thunder":
        return thunder.jit(fn)
    if kind == "thunderfx+fuser":  # ThunderFX: Dynamo's graph, each piece thunder supports through ours
        from thunder.dynamo import ThunderCompiler

        backend = ThunderCompiler(executors=thunder_executors("thunder+fuser"), transforms=thunder_transforms("thunder+fuser"))
        compiled = torch.compile(fn, backend=backend)
        compiled.thunderfx_backend = backend  # its pieces' traces: ``thunder_functions``
        return compiled
    jfn = thunder.jit(fn, executors=thunder_executors(kind), transforms=thunder_transforms(kind))
    if kind.endswith("no-region-graphs"):  # the regions' launches made plainly (``cudagraphs/region_graphs.py``)
        from thunder_fuser.cudagraphs.region_graphs import turned_off

        return _called_within(jfn, turned_off)
    if kind.endswith("no-recompute"):  # nothing made again in the backward (``passes/recompute_in_backward.py``)
        return _called_within(jfn, lambda: _setting("THUNDER_FUSER_RECOMPUTE", "0"))
    for suffix, value in ((" no-gqa", "0"), (" gqa", "1")):
        if kind.endswith(suffix):
            return _called_within(jfn, lambda value=value: _setting("THUNDER_FUSER_GQA", value))
    return thunder_fuser.graphed(jfn) if kind.endswith("graphed") else jfn


def _called_within(jfn, context):
    """``jfn``, each call inside ``context()``: a variant of thunder + fuser set at its compile
    (the first call traces and fuses) and kept for every call after."""

    def within(*args, **kwargs):
        with context():
            return jfn(*args, **kwargs)

    within.jitted = jfn
    return within


@contextlib.contextmanager
def _setting(name: str, value: str):
    """A thunder_fuser setting (``thunder_fuser/config.py``) as ``value`` for the calls inside,
    so two variants of one contender run in one process."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
