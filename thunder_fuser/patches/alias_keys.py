"""thunder's per-call aliasing key without its Python loop, where no two tensors share storage.

Every call of a ``thunder.jit`` function (each ThunderFX piece included) groups its tensor
arguments by storage (``_alias_tensor_of_args_kwargs``, a closure ``thunder.jit`` makes) to
pick the trace made for that aliasing: a ``tree_flatten``, then per tensor a loop iteration
with two dict updates. An optimizer step passes every parameter, gradient and moment: 444
plain tensors of GPT-2's AdamW took 1.04 ms of a 3.55 ms step on the H200's host.

Where the arguments are leaves of thunder's ``tree_flatten`` (a tensor, a number, ``None``:
what ThunderFX passes) or lists, tuples and string-keyed dicts of them (a jitted optimizer
step's update: lists of tensors and keyword constants, where thunder's function took 2.3 ms
of a step's host time for 592 tensors on a CPU host), the storages' addresses are read in a
walk that reads each list of leaves in one comprehension, and compared as a set: all
distinct, the key is ``""``, as thunder's would be; anything else met, or any storage
shared, and thunder's own function answers. The answer is thunder's in every case; only the
common one is quicker (0.26 against 0.64 ms for 592 tensors on a CPU host). Installed on
each function ``thunder.jit`` makes (it wraps ``thunder.jit``; a caller that bound
``from thunder import jit`` before ``thunder_fuser`` was imported keeps thunder's), on
thunder 0.2.6 only.
"""

from __future__ import annotations

import torch

from thunder_fuser.patches.wrap import on_each_jitted

_LEAVES = frozenset((torch.Tensor, torch.nn.Parameter, int, float, bool, str, type(None), torch.dtype, torch.device))


def _storage_ptrs(obj, out: list) -> bool:
    """Append the storage address of every plain strided tensor in ``obj`` (leaves, lists,
    tuples, dicts of them, as thunder's ``tree_flatten`` walks them) to ``out``; False where
    something else is met. thunder groups only ``type(t) is torch.Tensor``: a ``Parameter``
    is skipped as there."""
    kind = type(obj)
    if kind is list or kind is tuple:
        if set(map(type, obj)) <= _LEAVES:  # leaves only: one comprehension, no call per element
            out += [t.untyped_storage().data_ptr() for t in obj if type(t) is torch.Tensor and t.layout is torch.strided]
            return True
        return all(_storage_ptrs(x, out) for x in obj)
    if kind is dict:
        return all(type(k) is str for k in obj) and all(_storage_ptrs(v, out) for v in obj.values())
    if kind is torch.Tensor:
        if obj.layout is torch.strided:
            out.append(obj.untyped_storage().data_ptr())
        return True
    return kind in _LEAVES


def storages_distinct(*objs) -> bool:
    """Whether thunder's alias key of arguments ``objs`` is ``""``: every plain strided tensor
    in them on a storage of its own (False too where something other than thunder's leaves,
    lists, tuples and string-keyed dicts is met)."""
    ptrs: list = []
    return all(_storage_ptrs(o, ptrs) for o in objs) and len(set(ptrs)) == len(ptrs)


def quick_alias_key(original):
    """``original`` (thunder's ``_alias_tensor_of_args_kwargs``), answered without its loop
    where no two plain tensors among the arguments share storage."""

    def alias_key(*args, **kwargs) -> str:
        if storages_distinct(args, kwargs):
            return ""
        return original(*args, **kwargs)

    alias_key.original = original
    return alias_key


def _install(jitted) -> None:
    """Swap the key function in the closure of ``jitted``'s ``populate_cache_info``."""
    import thunder

    populate = getattr(thunder.compile_data(jitted), "populate_cache_info", None)
    code = getattr(populate, "__code__", None)
    if code is None or populate.__closure__ is None:
        return
    for name, cell in zip(code.co_freevars, populate.__closure__):
        if name == "_alias_tensor_of_args_kwargs" and not hasattr(cell.cell_contents, "original"):
            cell.cell_contents = quick_alias_key(cell.cell_contents)


def quick_alias_keys() -> bool:
    """Wrap ``thunder.jit`` so that each function it makes gets the quick key; whether it
    took (another thunder keeps its own)."""
    return on_each_jitted("quick_alias_keys", _install)
