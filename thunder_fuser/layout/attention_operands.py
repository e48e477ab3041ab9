"""Attention's operands laid out heads inside the sequence, as the projections lay them out.

Attention (``attention.py``: cuDNN's on the GPU) reads q, k and v as ``[b, h, s, d]`` with
any strides whose last one is 1, and allocates its output and the gradients of q, k and v
like q (cuDNN's rule, which the CPU path copies). What it hands back is then permuted to
``[b, s, h, d]`` and reshaped to ``[b, s, h * d]`` for the output projection: a view only
when the output's memory holds the heads inside the sequence, else torch copies it
element by element, once per layer (Llama-3.2-1B's full-depth step on the H200: 32 such
copies outside our regions, 0.88 ms).

A region output that attention reads is laid out in order ``(0, 2, 1, 3)``, the order the
q, k and v projections produce, so that the output, its gradient from the projection's
matmul and the gradients of q, k and v are all views of ``[b, s, h * d]`` memory. The
order changes only outputs the plan allocates (a view output keeps its source's layout);
the region's kernel then writes ``d``-long runs, as it does for a contiguous output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thunder_fuser.ir.region import Region

# attention op -> the argument positions it reads as [b, h, s, d] (the forward's q, k, v;
# the backward's output gradient, q, k, v and output)
ATTENTION_OPERANDS = {"fuser_attention_forward": (0, 1, 2), "fuser_attention_backward": (0, 1, 2, 3, 4)}
HEADS_INSIDE = (0, 2, 1, 3)


def attention_reads(calls) -> frozenset[str]:
    """Names of the tensors attention reads as its ``[b, h, s, d]`` operands, from
    ``(op name, argument names)`` per call (a non-tensor argument's name is None)."""
    names = set()
    for op, args in calls:
        for i in ATTENTION_OPERANDS.get(op, ()):
            if i < len(args) and args[i] is not None:
                names.add(args[i])
    return frozenset(names)


def lay_out_for_attention(region: Region, orders: dict, fresh: set[int]) -> list[str]:
    """Lay out each 4-d output the plan allocates and attention reads heads inside the
    sequence; a line per output whose order this changed."""
    notes = []
    for o in region.outputs:
        if o.name in region.attention_reads and o.ndim == 4 and id(o) in fresh and id(o) in orders:
            if orders[id(o)] != HEADS_INSIDE:
                notes.append(f"output {o.name} in order {HEADS_INSIDE}, not {orders[id(o)]}: attention reads it")
            orders[id(o)] = HEADS_INSIDE
    return notes
