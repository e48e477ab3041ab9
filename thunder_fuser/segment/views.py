"""Which of a segment's outputs are views, made by torch after its kernel, and which values
a plan allocates.

A segment output that is a view of a segment input or of another output (a reshape of
the kernel's result, SDPA's q, k and v as views of a QKV projection) is not stored by the
kernel: torch makes it on the tensors the kernel wrote, so that it aliases its source as
in eager, unless a plan chooses to store it (``Segment.stored_views``,
``plan/stored_views.py``).
"""

from __future__ import annotations

from thunder_fuser.ir.ops import METADATA
from thunder_fuser.ir.region import Node, Region
from thunder_fuser.layout.allocation_order import zero_dims
from thunder_fuser.ir.reshape_groups import reshape_groups
from thunder_fuser.segment.segmenter import Segment


def alias_views(seg: Segment) -> list[Node]:
    """The view nodes (in segment order) that make outputs which are views of a segment
    input or of another output. torch runs them after the kernel, on the tensors it wrote:
    a stored copy would not alias its source, and an in-place update of one must show in
    the other (``e = c.view(-1); e += d`` changes ``c``)."""
    producer = {id(o): n for n in seg.nodes for o in n.outputs}
    visible = {id(v) for v in seg.inputs} | {id(o) for o in seg.outputs}
    chosen: set[int] = set()
    for o in seg.outputs:
        if id(o) in seg.stored_views:
            continue
        chain, v = [], o
        while id(v) in producer and producer[id(v)].op in METADATA:
            node = producer[id(v)]
            if copies_to_reshape(node, producer):
                break
            chain.append(node)
            v = node.args[0]
            if id(v) in visible:
                chosen.update(id(n) for n in chain)
                break
    return [n for n in seg.nodes if id(n) in chosen]


def copies_to_reshape(node: Node, producer: dict) -> bool:
    """Whether torch must copy to make this reshape: it merges a broadcast dim (stride 0)
    with a dim that is not one (grouped-query attention's K and V expanded over the query
    heads of each group, then reshaped to the heads). The segment's kernel stores it
    instead: torch's copy would be a launch of its own outside the region."""
    if node.op != "reshape":
        return False
    src = node.args[0]
    zeros = _broadcast_dims(src, producer)
    groups = reshape_groups(tuple(src.shape), tuple(node.outputs[0].shape))
    if groups is None:
        return True
    for dims, _ in groups:
        big = [d for d in dims if src.shape[d] != 1]
        if len(big) > 1 and any(d in zeros for d in big) and not all(d in zeros for d in big):
            return True
    return False


def _broadcast_dims(v, producer: dict) -> frozenset:
    """``v``'s stride-0 dims, through the views (``producer``) that made it."""
    node = producer.get(id(v))
    operands = node.tensor_inputs() if node is not None else []
    if not operands:
        return v.broadcast_dims
    return zero_dims(node, operands, {id(operands[0]): _broadcast_dims(operands[0], producer)})


def fresh_values(region: Region, segments: list[Segment]) -> set[int]:
    """Ids of the values the plan allocates. Outputs that are views of a segment's inputs or
    outputs (all of a view segment's; the SDPA-bound v beside a kernel's scaled q and k)
    are made by torch: nothing to allocate, and no copy into a chosen layout (for the GPT
    block's v it cost 0.16 ms a step)."""
    fresh = {id(o) for n in region.nodes if n.op not in ("copy_", "copy_to_out_", "update_aliases") for o in n.outputs}
    fresh -= {id(v) for v in region.inputs}
    fresh -= {id(o) for seg in segments for n in alias_views(seg) for o in n.outputs}
    return fresh
