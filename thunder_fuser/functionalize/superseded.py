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
  value computed in this region (not an input's), and after the write nothing reads it,
  nor is any of it returned, other than as ``o`` or views taken of ``o`` (transformers'
  causal mask: ``full``, then ``mask *= arange > position``, then views of it returned).
  The buffer is then invisible, so ``o`` is simply ``c`` (and those views, views of ``c``).
  ``o`` may be returned (a foreach op's result written in place, ``torch._foreach_sqrt_``
  of ``torch._foreach_pow(...)``'s list, then returned): the region then returns ``c``, a
  tensor it computes, under ``o``'s name. Kept, that write was a segment's store into a
  tensor no input holds, which no kernel can make (its step counters' segment, the
  optimizer step's, ran op by op in torch).
"""

from __future__ import annotations

from thunder_fuser.ir.ops import METADATA
from thunder_fuser.ir.region import Region, Value, map_values


def elide_superseded_writes(region: Region, roots: dict[int, Value]) -> None:
    """Rewrite ``region`` in place; ``roots`` maps value ids to their storage root."""
    out_ids = {id(v) for v in region.outputs}
    inputs = {id(v) for v in region.inputs}
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
    computed = {id(o): n for n in nodes if n.op not in METADATA for o in n.outputs}
    for i, w in enumerate(nodes):
        if w.op != "copy_to_out_":
            continue
        dst, o = w.kwargs["out"], w.output
        root = roots.get(id(dst), dst)
        later_reads = [j for j in reads.get(id(o), []) if j > i]
        nxt = next((j for j in later_reads if nodes[j].op == "copy_to_out_" and nodes[j].kwargs["out"] is o), None)
        if id(o) in out_ids and (nxt is not None or not _fresh(w.args[0], computed, out_ids)):
            continue  # returned: only a temporary's write, its value a tensor of its own, is elided
        if nxt is not None:  # superseded
            if any(j > nxt for j in later_reads) or read_between(root, o, i, nxt):
                continue
            nodes[nxt].kwargs["out"] = dst
        elif id(root) in inputs or _seen_other_than_through(o, i, root, nodes, roots, memory_reads, region.outputs):
            continue  # not a temporary, or its memory read after the write other than as o
        subst[id(o)] = w.args[0]
        w.args[0].laid_out_as = dst  # its only reader was this write: o's readers read it as dst's memory
        drop.add(i)
        region.notes.append(f"{o.name}: write of {w.args[0].name} into {dst.name} elided (overwritten or invisible "
                            f"before any read): {o.name}'s readers read {w.args[0].name}")
    if not drop:
        return
    swap = lambda v: subst.get(id(v), v)  # noqa: E731
    for k, v in enumerate(region.outputs):
        if id(v) in subst:  # a returned temporary: its value, under the name the trace returns
            subst[id(v)].name = v.name
            region.outputs[k] = subst[id(v)]
    kept = []
    for i, n in enumerate(nodes):
        if i in drop:
            continue
        n.args = map_values(n.args, swap)
        n.kwargs = {k: (v if k == "out" else map_values(v, swap)) for k, v in n.kwargs.items()}
        kept.append(n)
    region.nodes = kept


def _fresh(c, computed: dict, out_ids: set) -> bool:
    """Is ``c`` a tensor this region computes (not an input, not a view of anything) and
    returns no other way? Returned in place of a temporary's write, it is then a tensor of
    its own, as the temporary was."""
    return id(c) in computed and id(c) not in out_ids and getattr(c, "is_tensor", False)


def _seen_other_than_through(o: Value, i: int, root: Value, nodes, roots, memory_reads, outputs) -> bool:
    """Is ``root``'s memory read after node ``i``, or returned, other than as ``o`` (written
    by node ``i``) or a view taken of ``o``?"""
    through = {id(o)}
    for n in nodes[i + 1:]:
        if n.op in METADATA and n.args and isinstance(n.args[0], Value) and id(n.args[0]) in through:
            through.update(id(x) for x in n.outputs)
    if any(j > i and id(v) not in through for j, v in memory_reads.get(id(root), ())):
        return True
    return any(roots.get(id(v), v) is root and id(v) not in through for v in outputs)
