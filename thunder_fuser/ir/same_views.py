"""One view where a region takes the same view of the same value twice.

A linear's backward reshapes the output gradient twice, once for each matmul: ``g.reshape(-1,
n)`` for the input gradient and ``g.reshape(-1, n).t()`` for the weight gradient. Where both
land in one region (``hoist_externs.hoist_views`` moves the weight gradient's operands into
the region before the input gradient's matmul), the second reshape would be an operand a
kernel reads through when the first is already an output torch makes after the kernel: the
QKV gradient's cat, reshaped then transposed, has no kernel template, and the segment ran
on the reference backend. Views are pure functions of their operand's memory, so the second
is the first: its readers read the first one, and the view of it is made from an output.
"""

from __future__ import annotations

from thunder_fuser.ir.ops import METADATA
from thunder_fuser.ir.region import Node, Region, Value, map_values


def _key(node: Node):
    def k(x):
        if isinstance(x, Value):
            return ("v", id(x))
        if isinstance(x, (tuple, list)):
            return tuple(k(e) for e in x)
        return x

    try:
        key = (node.op, k(node.args), tuple(sorted((n, k(v)) for n, v in node.kwargs.items())))
        hash(key)
    except TypeError:  # an argument that is not hashable: the node stays
        return None
    return key


def same_views(region: Region) -> None:
    """Rewrite ``region`` in place: each later duplicate of a view node is dropped, its
    output replaced by the first's everywhere (the region's outputs too)."""
    first: dict = {}
    subst: dict[int, Value] = {}
    kept: list[Node] = []
    swap = lambda v: subst.get(id(v), v)  # noqa: E731
    for node in region.nodes:
        if subst:
            node.args = map_values(node.args, swap)
            node.kwargs = {n: map_values(v, swap) for n, v in node.kwargs.items()}
        key = _key(node) if node.op in METADATA and len(node.outputs) == 1 else None
        if key is not None and key in first:
            subst[id(node.output)] = first[key]
            continue
        if key is not None:
            first[key] = node.output
        kept.append(node)
    if subst:
        region.nodes = kept
        region.outputs = [swap(v) for v in region.outputs]
