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
    hidden = {id(v) for v in region.inputs} | {id(roots.get(id(v), v)) for v in region.outputs}
    nodes = region.nodes
    # one pass: who reads each value, and who reads each memory (through any view)
    reads: dict[int, list[int]] = {}
    memory_reads: dict[int, list[tuple[int, Value]]] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs():
            reads.setdefault(id(v), []).append(i)
            memory_reads.setdefault(id(roots.get(id(v), v)), []).append((i, v))

    def read_between(root: Value, o: Value, lo: int, hi: int) -> bool:
        """A node in (lo, hi) reads ``root``'s memory other than through ``o``."""
        return any(lo < j < hi and v is not o for j, v in memory_reads.get(id(root), ()))

    subst: dict[int, Value] = {}
    drop: set[int] = set()
    for i, w in enumerate(nodes):
        if w.op != "copy_to_out_" or id(w.output) in out_ids:
            continue
        dst, o = w.kwargs["out"], w.output
        root = roots.get(id(dst), dst)
        later_reads = [j for j in reads.get(id(o), []) if j > i]
        nxt = next((j for j in later_reads if nodes[j].op == "copy_to_out_" and nodes[j].kwargs["out"] is o), None)
        if nxt is not None:  # superseded
            if any(j > nxt for j in later_reads) or read_between(root, o, i, nxt):
                continue
            nodes[nxt].kwargs["out"] = dst
        elif id(root) in hidden or read_between(root, o, i, len(nodes)):
            continue  # not a temporary, or read after the write
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
