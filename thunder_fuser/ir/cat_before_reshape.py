"""Concatenate before merging dims: ``cat(reshape(x_i))`` becomes ``reshape(cat(x_i))``.

A GPT block's backward joins the q, k and v gradients into the fused projection's
gradient: each piece is ``[b, h, s, e]``, transposed to ``[b, s, h, e]``, reshaped to
``[b, s, h*e]``, and the pieces are concatenated along that last dim. No strided view
merges ``h`` and ``e`` of a transposed tensor, so no kernel can read a piece as
``[b, s, h*e]``, and the segment ran op by op on torch (0.46 ms of a 3.4 ms step on the
H100). Concatenating first, along ``h`` of the ``[b, s, h, e]`` pieces, gives the same
elements in the same order, because every piece has the same ``e``; the kernel then reads
each transposed piece as the strided view it is, and the merge that follows reshapes a
tensor the kernel has just written contiguously: a view, no copy.

The rewrite applies where every piece is the reshape of a transpose (the case no view can
express; elsewhere the reshape is usually a view already and the longer rows of the
merged dim suit the kernel better) and each piece's reshape only merges dims into the
concatenated one.

A pad is a cat with zeros, and thunder writes the backward of a split as pads of each
piece's gradient (transformers' Phi3: q's gradient padded into the fused projection's,
``pad(reshape(transpose(dq)))``): the same rewrite pads along the outer merged dim first
where the pad's widths are whole runs of the inner dims (``pad_before_reshape``).
"""

from __future__ import annotations

import math

from thunder_fuser.ir.region import Node, Region, Value


def _merge_group(q: tuple, p: tuple, d: int) -> tuple[int, int] | None:
    """The dims ``[d, end)`` of ``q`` that reshaping ``q`` to ``p`` merges into dim ``d``,
    when the reshape leaves every other dim as it is; else None."""
    trail = len(p) - d - 1
    end = len(q) - trail
    if end <= d or q[:d] != p[:d] or q[end:] != p[d + 1:] or math.prod(q[d:end]) != p[d]:
        return None
    return d, end


def cat_before_reshape(region: Region) -> None:
    producer = region.producers()
    uses = region.consumers()
    out_ids = {id(v) for v in region.outputs}
    rewritten: dict[int, list[Node]] = {}  # id(cat node) -> its replacement
    dropped: set[int] = set()
    for node in region.nodes:
        if node.op != "cat":
            continue
        pieces, dim = node.args[0], node.args[1]
        d = dim % len(node.output.shape)
        sources, groups = [], set()
        for p in pieces:
            r = producer.get(id(p))
            if r is None or r.op != "reshape" or id(p) in out_ids or len(uses.get(id(p), ())) != 1:
                break
            q = r.args[0]
            t = producer.get(id(q))
            group = _merge_group(tuple(q.shape), tuple(p.shape), d)
            if t is None or t.op != "transpose" or group is None:
                break
            groups.add((len(q.shape), tuple(q.shape[group[0] + 1:group[1]])))
            sources.append((r, q))
        else:
            if len(groups) != 1:
                continue  # pieces must agree on the merged dims inside the concatenated one
            qs = [q for _, q in sources]
            shape = list(qs[0].shape)
            shape[d] = sum(q.shape[d] for q in qs)
            joined = Value(f"{node.output.name}_split", tuple(shape), node.output.dtype)
            rewritten[id(node)] = [
                Node("cat", (qs, d), {}, (joined,)),
                Node("reshape", (joined, tuple(node.output.shape)), {}, node.outputs),
            ]
            dropped.update(id(r) for r, _ in sources)
    _replace(region, rewritten, dropped)


def pad_before_reshape(region: Region) -> None:
    """``pad(reshape(transpose(x)))`` along one merged dim, by whole runs of the dims merged
    inside it, becomes ``reshape(pad(transpose(x)))`` (module docstring)."""
    producer = region.producers()
    uses = region.consumers()
    out_ids = {id(v) for v in region.outputs}
    rewritten: dict[int, list[Node]] = {}
    dropped: set[int] = set()
    for node in region.nodes:
        if node.op != "pad" or len(node.args) != 3:
            continue
        x, value, config = node.args
        widened = [i for i, (lo, hi, inner) in enumerate(config) if (lo, hi, inner) != (0, 0, 0)]
        r = producer.get(id(x)) if isinstance(x, Value) else None
        if len(widened) != 1 or r is None or r.op != "reshape" or id(x) in out_ids or len(uses.get(id(x), ())) != 1:
            continue
        (d,) = widened
        lo, hi, interior = config[d]
        q = r.args[0]
        t = producer.get(id(q))
        group = _merge_group(tuple(q.shape), tuple(x.shape), d)
        if t is None or t.op != "transpose" or group is None or interior != 0 or lo < 0 or hi < 0:
            continue
        run = math.prod(q.shape[group[0] + 1:group[1]])
        if lo % run or hi % run:
            continue
        shape = list(q.shape)
        shape[d] += (lo + hi) // run
        padded = Value(f"{node.output.name}_split", tuple(shape), node.output.dtype)
        widths = tuple((lo // run, hi // run, 0) if i == d else (0, 0, 0) for i in range(len(shape)))
        rewritten[id(node)] = [
            Node("pad", (q, value, widths), {}, (padded,)),
            Node("reshape", (padded, tuple(node.output.shape)), {}, node.outputs),
        ]
        dropped.add(id(r))
    _replace(region, rewritten, dropped)


def _replace(region: Region, rewritten: dict, dropped: set) -> None:
    """``region``'s nodes with each rewritten node's replacement and the dropped ones gone."""
    if not rewritten:
        return
    nodes = []
    for n in region.nodes:
        if id(n) in dropped:
            continue
        nodes.extend(rewritten.get(id(n), [n]))
    region.nodes = nodes
