"""Recompute cheap values in the consumer rather than store them in the producer.

thunder runs its fusion passes on the *joint* forward-backward trace. A forward fusion
then hands the backward every intermediate the backward reads: a tanh-GELU's forward over
``[8, 1024, 4096]`` stored seven fp32 tensors of that shape for its backward (0.57 ms on
the H100; 0.08 ms now that it writes the one bf16 output the block needs). thunder's min-cut
rematerialization (``thunder.core.rematerialization.rematerialize``, which its nvFuser and
torch.compile executors run in their fusion passes) picks, per pair of fusions where one
reads the other's outputs, the cheapest set of values to pass and moves the rest of the
computation into the consumer. Reductions, random and matmul results always stay stored.

**In-place writes.** Moving computation moves its reads later in time. A value recomputed
in the backward from an input that the forward (or anything between) wrote in place would
read the new contents, and a recomputed write would write twice. thunder's pass does not
guard against either, so this pass runs it only on traces with no in-place write at all
(``copy_``, our ``copy_to_out_``, any op thunder tags in-place): such a trace keeps every
value its fusions computed, as before.
"""

from __future__ import annotations

from thunder.core import prims
from thunder.core.trace import TraceCtx

from thunder_fuser.copy_prims import COPY_TO_OUT_ID

_WRITE_IDS = (prims.PrimIDs.COPY_, COPY_TO_OUT_ID, "copy_", "setitem_")


def writes_in_place(bsyms) -> bool:
    """Whether any of ``bsyms``, or any op inside them, writes a tensor in place."""
    for b in bsyms:
        if b.sym.id in _WRITE_IDS or (b.sym.tags and prims.OpTags.IN_PLACE in b.sym.tags):
            return True
        if writes_in_place(b.subsymbols):
            return True
    return False


def rematerialize_if_safe(trace: TraceCtx) -> TraceCtx:
    """thunder's rematerialization of ``trace``'s fusions, or ``trace`` itself where any
    op writes in place (see the module docstring)."""
    if writes_in_place(trace.bound_symbols):
        return trace
    from thunder.core.rematerialization import rematerialize

    return rematerialize(trace)
