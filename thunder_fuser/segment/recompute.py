"""Recompute a reduction's cheap pointwise inputs instead of passing them through memory.

A layernorm backward reduces ``x_hat * grad`` and ``grad`` twice: over each row (the input
gradient, a normalization segment) and over the rows (the weight and bias gradients, a
column reduction). One kernel cannot do both, and the segmenter places the shared
pointwise work with the row sums, so the normalization kernel stored both column
arguments in fp32 (8 bytes per element written, and read back by the column kernel: 128
MB per layernorm of the GPT block's backward) although they are a few flops from the bf16
``x`` and ``grad`` and the per-row mean and rstd, 4 bytes per element to read.

After segmentation, for each reduction segment, each input made by another segment from
pointwise ops (casts, broadcasts and views included) is recomputed in the reduction
segment from the values that cone starts from, where those are region inputs or values a
segment already returns and the full-size ones the reduction does not read already are
fewer bytes than the input (the fp32 layernorm: x alone, against x_hat * grad); a cone that
starts from a full-size value its own segment computes (one that would then have to be
stored) stays where it is. The producer then stores the input only if something else
reads it. A cone stops at a region output (stored anyway): walking on to the region's
inputs read GPT-2's position gradient, a sum over the batch, through the norm's per-row
statistics broadcast over both of its kept dims, which no column kernel takes, where the
norm's input gradient it returns is one dense read. Regions that write in place are left
alone: recomputing later would read after the write.
"""

from __future__ import annotations

from thunder_fuser.ir.ops import METADATA, kind_of
from thunder_fuser.ir.region import Node, Region, Value, map_values

_CHEAP = ("pointwise",)


def cheap(node: Node) -> bool:
    return len(node.outputs) == 1 and (kind_of(node.op) in _CHEAP or node.op in METADATA) and node.op != "slice_prim"


def _merges_permuted(node: Node, producer: dict) -> bool:
    """A reshape of a transpose (Qwen2's key bias gradient sums ``dk.transpose(1, 2)``
    reshaped to ``[b, s, h * e]``): at attention's strides it merges dims that are not
    adjacent in memory, which torch makes by a copy and no kernel operand can view. It stays
    with the segment that made it, a view torch makes (copying) for the reduction to read."""
    p = producer.get(id(node.args[0])) if node.op == "reshape" and node.args else None
    return p is not None and p.op == "transpose"


def _nbytes(v: Value) -> int:
    return v.numel * (v.dtype.itemsize if hasattr(v.dtype, "itemsize") else 8)


def recompute_reduction_inputs(region: Region, segments: list, seg_of: dict) -> None:
    """Clone into each reduction segment the cheap cones of its inputs (module docstring);
    ``seg_of`` (value id -> producing segment) is updated for the clones."""
    if region.writes():
        return
    producer = {id(o): n for s in segments for n in s.nodes for o in n.outputs}  # kept current below
    readers: dict[int, set[int]] = {}  # value id -> the segments that read it, other than its own
    for s in segments:
        for n in s.nodes:
            for v in n.inputs():
                if seg_of.get(id(v)) not in (None, s):
                    readers.setdefault(id(v), set()).add(s.index)
    for v in region.outputs:
        readers.setdefault(id(v), set()).add(-1)
    count = 0
    for seg in segments:
        if seg.kind != "reduction":
            continue
        reads = {id(v): v for n in seg.nodes for v in n.inputs() if v.is_tensor and seg_of.get(id(v)) not in (None, seg)}
        clones: dict[int, Value] = {}
        new_nodes: list[Node] = []
        reading = set(seg.reads)  # what the segment reads, with the clones' reads so far
        for v in reads.values():
            cone = _cone(v, reading, seg_of[id(v)], producer, seg_of, readers, seg.index)
            if cone is None:
                continue
            reading.update(id(x) for n in cone for x in n.inputs())
            for node in cone:
                if id(node.outputs[0]) in clones:
                    continue
                count += 1
                out = node.outputs[0]
                twin = Value(f"{out.name}_r{count}", out.shape, out.dtype, out.is_tensor, out.broadcast_dims)
                new_nodes.append(reading_clones(node, clones, (twin,)))
                producer[id(twin)] = new_nodes[-1]
                clones[id(out)] = twin
                seg_of[id(twin)] = seg
        if not new_nodes:
            continue
        for i, node in enumerate(seg.nodes):  # a copy of each node that reads a clone
            if any(id(x) in clones for x in node.inputs()):
                seg.nodes[i] = reading_clones(node, clones, node.outputs)
                producer.update((id(o), seg.nodes[i]) for o in node.outputs)
        seg.nodes[:0] = new_nodes
        seg.reads = {id(x) for n in seg.nodes for x in n.inputs()}


def reading_clones(node: Node, clones: dict, outputs: tuple) -> Node:
    """A copy of ``node`` making ``outputs``, reading each clone in place of its original."""
    lookup = lambda x: clones.get(id(x), x)  # noqa: E731
    return Node(node.op, map_values(node.args, lookup), {k: map_values(a, lookup) for k, a in node.kwargs.items()}, outputs)


def _cone(v: Value, reading: set, owner, producer: dict, seg_of: dict, readers: dict, here: int) -> list[Node] | None:
    """The cheap nodes of ``owner`` that compute ``v``, in order, or None where recomputing
    them in the segment that reads ``v`` (and the ids in ``reading``) would not save memory
    traffic (module docstring)."""
    nodes: dict[int, Node] = {}
    leaves: dict[int, Value] = {}
    stack = [v]
    while stack:
        x = stack.pop()
        n = producer.get(id(x))
        stored = x is not v and -1 in readers.get(id(x), ())  # a region output: its segment stores it anyway
        if n is None or stored or seg_of.get(id(x)) is not owner or not cheap(n) or _merges_permuted(n, producer):
            leaves[id(x)] = x
            continue
        if id(n) in nodes:
            continue
        nodes[id(n)] = n
        stack.extend(a for a in n.inputs() if a.is_tensor)
    if not nodes:
        return None
    cost = 0  # full-size reads the reader does not make already
    for x in leaves.values():
        if x.numel >= v.numel:
            if seg_of.get(id(x)) is owner and not readers.get(id(x)):
                return None  # a full-size value its segment would now have to store
            if id(x) not in reading:
                cost += _nbytes(x)
    saved = _nbytes(v) * (2 if readers.get(id(v)) == {here} else 1)  # its read, and its store if only here
    if cost >= saved:
        return None
    order = {id(n): i for i, n in enumerate(owner.nodes)}
    return sorted(nodes.values(), key=lambda n: order[id(n)])
