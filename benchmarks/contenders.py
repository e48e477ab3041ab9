"""The whole-model contenders, one way for every harness (``models.py``, ``decode.py``,
``distributed.py``): a model or step function as each contender runs it. thunder with the
torch.compile executor gets thunder's ``sdpa_ex`` too, as thunder + fuser gets attention
beside it (``thunder_fuser.executors()``): each thunder contender at its best on a model.
The kernel suite (``run.py``) compares single regions and keeps its own, with ``fuser_ex``
alone."""

from __future__ import annotations

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


def wrap(kind: str, fn):
    """``fn`` as contender ``kind`` runs it: eager, torch.compile (``... reduce-overhead``:
    with its CUDA graphs), thunder, thunder+torchcompile, thunder+fuser (``... graphed``:
    replayed by ``thunder_fuser.graphed``)."""
    if kind == "eager":
        return fn
    if kind == "torch.compile":
        return torch.compile(fn)
    if kind == "torch.compile reduce-overhead":
        return torch.compile(fn, mode="reduce-overhead")
    if kind == "thunder":
        return thunder.jit(fn)
    if kind.startswith("thunder+fuser"):
        jfn = thunder.jit(fn, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    else:
        jfn = thunder.jit(fn, executors=thunder_executors(kind))
    return thunder_fuser.graphed(jfn) if kind.endswith("graphed") else jfn
