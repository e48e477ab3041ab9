"""A guard for inputs that share storage as different views.

thunder 0.2.6 traces a call whose tensor inputs share a storage, in a program that writes in
place, with every such input replaced by the first of its group (reshaped to its shape:
``update_aliases.replace_args_with_alias_map``). That is right when they are one view (the
same tensor passed twice); for different views (a key and a value cache as two halves of one
buffer) every executor computes a wrong result and writes the wrong memory, thunder's own
included (``tests/test_graphs.py``). Where thunder made that replacement, the fusion pass
puts this guard first in the trace: at each call it checks that inputs sharing a storage are
the view thunder took them for, and otherwise raises, naming both inputs and the rule,
before anything is computed or written.
"""

from __future__ import annotations

import torch
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, from_trace
from thunder.core.pytree import tree_flatten
from thunder.extend import OperatorExecutor, register_executor

from thunder_fuser.functionalize import AliasError

guard_ex = OperatorExecutor("fuser_input_aliases", version="0.1")
register_executor(guard_ex)

_HEADER = "[alias tensor args]"  # how thunder marks a call whose inputs it replaced


def _same_view_as_thunder_takes(first: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether ``first`` reshaped to ``other``'s shape (thunder's stand-in) is ``other``."""
    if first.data_ptr() != other.data_ptr():
        return False
    if first.shape == other.shape:
        return first.stride() == other.stride()
    return first.numel() == other.numel() and first.is_contiguous() and other.is_contiguous()


def _check(*tensors, names: tuple):
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(tensors):
        if type(t) is torch.Tensor and t.layout is torch.strided:
            groups.setdefault(t.untyped_storage().data_ptr(), []).append(i)
    for members in groups.values():
        first = tensors[members[0]]
        for i in members[1:]:
            if not _same_view_as_thunder_takes(first, tensors[i]):
                raise AliasError(
                    f"inputs '{names[members[0]]}' and '{names[i]}' share storage as different views "
                    f"(offsets {first.storage_offset()} and {tensors[i].storage_offset()}, strides "
                    f"{tuple(first.stride())} and {tuple(tensors[i].stride())}): thunder 0.2.6 traces inputs "
                    "that share storage, in a program that writes in place, as one tensor, which would "
                    "compute a wrong result. Pass them as separate tensors, or pass the buffer they are "
                    "views of and take the views inside the function."
                )


def _meta(*tensors, names: tuple):
    return None


inputs_are_the_views_thunder_took = guard_ex.register_operator(
    "fuser_inputs_are_the_views_thunder_took", meta=_meta, fn=_check, tags=(OpTags.DONT_DCE,))


def needs_alias_guard(trace: TraceCtx) -> bool:
    """Did thunder replace inputs sharing storage in ``trace``?"""
    return any(b.header and _HEADER in str(b.header) for b in trace.bound_symbols)


def with_alias_guard(trace: TraceCtx) -> TraceCtx:
    """``trace`` with the guard first (after the unpacking of its arguments), for a trace in
    which thunder replaced inputs sharing storage (``needs_alias_guard``). The replaced inputs
    stay in the signature but lose their unpacking, so the fusion pass adds the guard after
    fusing: thunder's dataflow grouping needs a producer for every input it sees."""
    tensors = [a for a in tree_flatten((trace.args, trace.kwargs))[0] if isinstance(a, TensorProxy)]
    if len(tensors) < 2:
        return trace
    names = tuple(t.name for t in tensors)
    guard = inputs_are_the_views_thunder_took.bind(*tensors, names=names, output=None)
    out = from_trace(trace)
    bsyms = list(trace.bound_symbols)
    at = 0  # after the unpacking of the arguments
    while at < len(bsyms) and bsyms[at].sym.name.startswith("unpack"):
        at += 1
    out.bound_symbols = bsyms[:at] + [guard] + bsyms[at:]
    return out
