"""Attention's operands laid out heads inside the sequence, as the projections lay them out.

Attention (``attention.py``: cuDNN's on the GPU) reads q, k and v as ``[b, h, s, d]`` with
any strides whose last one is 1, and allocates its output and the gradients of q, k and v
like q (cuDNN's rule, which the CPU path copies). What it hands back is then permuted to
``[b, s, h, d]`` and reshaped to ``[b, s, h * d]`` for the output projection: a view only
when the output's memory holds the heads inside the sequence, else torch copies it
element by element, once per layer (Llama-3.2-1B's full-depth step on the H200: 32 such
copies outside our regions, 0.88 ms).

Where a program asks for ``x.contiguous()`` of attention's operand (transformers' SDPA path
makes q, k and v contiguous before the call), and the operand is a view of a tensor that
dies there, the copy is a view instead (``contiguous_for_attention_as_views``): attention
takes the projection's layout as it is, and its output and gradients follow it.

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


# views a chain from a region input to attention's operand may take: none broadcasts (an
# expanded K/V's reshape copies anyway)
_PLAIN_VIEWS = ("reshape", "transpose", "squeeze")


def contiguous_for_attention_as_views(region: Region) -> list[str]:
    """Make ``x.contiguous()`` (``stride_order``) a view where only its layout would change
    and nothing can tell: its result is a 4-d tensor attention reads (which takes any layout
    whose last dim is dense: ``attention._dense_last`` copies one that is not), reached
    through reshapes, transposes and squeezes from a region input that dies in this region
    (``dead_inputs``: nothing after it reads it, the trace made it and writes nothing in
    place), each value of the chain read by the chain alone. The copy is then the only
    tensor holding that memory. hf-ViT-Base's step on the H100: 48 ``contiguous`` and 36
    ``reshape`` copies and 13 ``copy_`` outside our regions, 1.0 ms of 29 (q, k, v made
    contiguous, their gradients and the output's then laid out otherwise than the
    projections). A line per copy made a view."""
    if not region.attention_reads or not region.dead_inputs:
        return []
    producers, consumers = region.producers(), region.consumers()
    inputs = {id(v) for v in region.inputs if v.name in region.dead_inputs}
    outputs = {id(o) for o in region.outputs}
    notes = []
    for n in region.nodes:
        out = n.output
        if n.op != "stride_order" or out.name not in region.attention_reads or out.ndim != 4:
            continue
        v = n.args[0]
        while id(v) not in inputs:
            p = producers.get(id(v))
            if p is None or p.op not in _PLAIN_VIEWS or id(v) in outputs or len(consumers.get(id(v), ())) != 1:
                break
            v = p.args[0]
        if id(v) not in inputs or len(consumers.get(id(v), ())) != 1:
            continue
        n.op, n.args, n.kwargs = "shallow_copy", (n.args[0],), {}
        n.text = f"{out.name} = shallow_copy({n.args[0].name})  # x.contiguous() as a view: attention reads it"
        notes.append(f"{out.name}: x.contiguous() as a view of {v.name}, which dies here: attention reads it in "
                     "any layout, and no reader can tell the layouts apart")
    region.notes.extend(notes)
    return notes
