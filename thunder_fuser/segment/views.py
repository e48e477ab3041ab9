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
            chain.append(node)
            v = node.args[0]
            if id(v) in visible:
                chosen.update(id(n) for n in chain)
                break
    return [n for n in seg.nodes if id(n) in chosen]


def fresh_values(region: Region, segments: list[Segment]) -> set[int]:
    """Ids of the values the plan allocates. Outputs that are views of a segment's inputs or
    outputs (all of a view segment's; the SDPA-bound v beside a kernel's scaled q and k)
    are made by torch: nothing to allocate, and no copy into a chosen layout (for the GPT
    block's v it cost 0.16 ms a step)."""
    fresh = {id(o) for n in region.nodes if n.op not in ("copy_", "copy_to_out_", "update_aliases") for o in n.outputs}
    fresh -= {id(v) for v in region.inputs}
    fresh -= {id(o) for seg in segments for n in alias_views(seg) for o in n.outputs}
    return fresh
