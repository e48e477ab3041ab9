"""Which tensors a fusion may write its output over: those it is the last to read.

fuser_ex fuses the joint trace (forward and backward in one, before thunder splits them):
a tensor the backward reads last is dead after that backward fusion.

A backward's loss gradient is as large as the logits it reads, and the logits are dead
once it has read them: written over them, the gradient costs no second buffer of
``[tokens, vocab]`` (pythia's step peaked with both alive, 1.2x torch.compile's peak). An
input qualifies here, from the trace alone, when nothing after the fusion reads it, the
trace does not return it, and the trace made it itself or unpacked it from the tensors its
forward saved (never a cotangent, ``get_grad``'s: autograd may hand one tensor to several
functions; never an input of the trace: it is the caller's). What an async collective sends
is read until its ``wait``, not only where the collective is called. Traces that write in place
donate nothing. The run-time half (``runtime/donation.py``) then checks that only the trace
holds the tensor.
"""

from __future__ import annotations

from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.trace import TraceCtx

from thunder_fuser.passes.communication_schedule import future_inputs, is_wait
from thunder_fuser.passes.rematerialize import writes_in_place

_SAVED = "saved_for_backward"
_NOT_READS = (prims.PrimIDs.DEL, prims.PrimIDs.RETURN)  # a del, and the return (``returned``)


def _proxies(x) -> list:
    return [p for p in tree_flatten(x)[0] if isinstance(p, TensorProxy)]


def _made_in_trace(trace: TraceCtx) -> set[str]:
    """Names of the tensors the trace computes or unpacks from what its forward saved."""
    from_saved = {_SAVED}
    made: set[str] = set()
    for b in trace.bound_symbols:
        if b.sym.name == "unpack_sequence" or b.sym.name == "unpack_trivial":
            src = b.args[0] if b.args else None
            if getattr(src, "name", None) in from_saved:
                outs = b.output if isinstance(b.output, (list, tuple)) else [b.output]
                from_saved.update(getattr(o, "name", None) for o in outs)  # nested lists: C0, C1
                made.update(p.name for p in outs if isinstance(p, TensorProxy))
            continue
        if b.sym.name == "get_grad":  # a cotangent: autograd's tensor
            continue
        if b.sym.is_fusion or not b.sym.name.startswith("unpack"):
            made.update(p.name for p in b.flat_proxy_outs if isinstance(p, TensorProxy))
    return made


def _in_execution_order(trace: TraceCtx) -> list:
    """The bound symbols in the order they run: a joint trace's forward part, then its
    backward part (``thunder.transforms.autodiff.split_into_forward_and_backward`` splits it
    so after the fusion passes; a backward op the joint trace holds before a forward one runs
    after it). The forward part: what the forward's outputs need, the way thunder's split
    finds it."""
    bsyms = list(trace.bound_symbols)
    ret = bsyms[-1] if bsyms and bsyms[-1].sym.id == prims.PrimIDs.RETURN else None
    spec = ret.args[0] if ret is not None and ret.args else None
    if not (isinstance(spec, dict) and "fw_flat_out" in spec):
        return bsyms
    forward_names = {p.name for p in tree_flatten(spec["fw_flat_out"])[0] if hasattr(p, "name")}
    forward_names.update(a.name for a in spec.get("flat_args", ()) if hasattr(a, "name"))
    forward = set()
    for b in reversed(bsyms[:-1]):
        if b.sym.name == "get_grad":
            continue
        outs = [o.name for o in b.flat_proxy_outs]
        if any(n in forward_names for n in outs) or b.sym.name == "unpack_trivial":
            forward.add(id(b))
            forward_names.update(a.name for a in b.flat_proxy_args)
            forward_names.update(outs)
    return [b for b in bsyms if id(b) in forward] + [b for b in bsyms if id(b) not in forward]


def dead_inputs(trace: TraceCtx) -> dict[tuple[str, ...], frozenset[str]]:
    """Per fusion of ``trace`` (keyed by its output names), its tensor inputs that may be
    written over (see the module's docstring)."""
    if writes_in_place(trace.bound_symbols):
        return {}
    made = _made_in_trace(trace)
    returned = {p.name for p in _proxies(trace.output)}
    read_after: set[str] = set()
    out: dict[tuple[str, ...], frozenset[str]] = {}
    sent = future_inputs(trace.bound_symbols)
    for b in reversed(_in_execution_order(trace)):
        if b.sym.id in _NOT_READS:
            continue
        args = {p.name for p in b.flat_proxy_args if isinstance(p, TensorProxy)}
        if is_wait(b):  # an async collective reads its inputs until its wait
            args |= sent.get(b.flat_proxy_args[0].name, set()) if b.flat_proxy_args else set()
        if b.sym.is_fusion:
            key = tuple(p.name for p in b.flat_proxy_outs)
            out[key] = frozenset(n for n in args if n in made and n not in returned and n not in read_after)
        read_after |= args
    return out
