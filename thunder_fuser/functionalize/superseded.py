"""Drop in-place writes whose memory is overwritten before anyone can see it.

An optimizer step writes a parameter twice (``p.mul_(1 - lr*wd)`` then ``p.addcdiv_(...)``)
and ``denom.add_(eps)`` writes into a temporary. Done literally, each write is an extra
store of the whole tensor. A ``copy_to_out_`` is dropped, and its result renamed to the
value it stores, when no one can observe the memory between it and the next write:

* **superseded**: ``o1 = copy_to_out_(c1, out=d)`` is followed by
  ``o2 = copy_to_out_(c2, out=o1)``; ``o1`` is not returned; every read of ``o1`` comes
  before that second write; and nothing else reads ``d``'s memory in between (a view of
  ``d`` would see the first write). The second write then targets ``d`` directly.
* **into a temporary**: ``o = copy_to_out_(c, out=t)`` where ``t``'s memory belongs to a
  value computed in this region (not an input's), no returned value shares that memory,
  and nothing after the write reads it through any view. The buffer is then invisible, so
  ``o`` is simply ``c``.
"""

from __future__ import annotations

from thunder_fuser.ir.region import Region, Value, map_values


def elide_superseded_writes(region: Region, roots: dict[int, Value]) -> None:
    """Rewrite ``region`` in place; ``roots`` maps value ids to their storage root."""
    out_ids = {id(v) for v in region.outputs}
    input_roots = {id(v) for v in region.inputs}
    subst: dict[int, Value] = {}
    drop: set[int] = set()
    nodes = region.nodes
    reads: dict[int, list[int]] = {}  # value id -> indices of nodes reading it
    for i, n in enumerate(nodes):
        for v in n.inputs():
            reads.setdefault(id(v), []).append(i)
    for i, w in enumerate(nodes):
        if w.op != "copy_to_out_" or id(w.output) in out_ids:
            continue
        dst, o = w.kwargs["out"], w.output
        later_reads = [j for j in reads.get(id(o), []) if j > i]
        nxt = next((j for j in later_reads if nodes[j].op == "copy_to_out_" and nodes[j].kwargs["out"] is o), None)
        if nxt is not None:
            if any(j > nxt for j in later_reads) or _memory_read_between(nodes, i, nxt, roots, roots.get(id(dst), dst), o):
                continue
            nodes[nxt].kwargs["out"] = dst
        elif not _invisible_after(nodes, i, o, roots.get(id(dst), dst), roots, input_roots, region.outputs):
            continue
        subst[id(o)] = w.args[0]
        drop.add(i)
        region.notes.append(f"{o.name}: write into {dst.name} elided (overwritten or invisible before any read)")
    if not drop:
        return
    swap = lambda v: subst.get(id(v), v)  # noqa: E731
    kept = []
    for i, n in enumerate(nodes):
        if i in drop:
            continue
        n.args = map_values(n.args, swap)
        n.kwargs = {k: (v if k == "out" else map_values(v, swap)) for k, v in n.kwargs.items()}
        kept.append(n)
    region.nodes = kept


def _memory_read_between(nodes, i, j, roots, root, o) -> bool:
    """Whether a node strictly between ``i`` and ``j`` reads ``root``'s memory other than
    through ``o`` itself."""
    for n in nodes[i + 1 : j]:
        for v in n.inputs():
            if v is not o and roots.get(id(v), v) is root:
                return True
    return False


def _invisible_after(nodes, i, o, root, roots, input_roots, outputs) -> bool:
    """Whether memory ``root`` is a region temporary that no one reads after node ``i``
    other than through ``o``, the write's own result (which becomes the stored value)."""
    if id(root) in input_roots or any(roots.get(id(v), v) is root for v in outputs):
        return False
    return not any(v is not o and roots.get(id(v), v) is root for n in nodes[i + 1 :] for v in n.inputs())
