"""Ordering rules that keep in-place writes correct once nodes are grouped into kernels.

Inside one kernel every thread reads and writes its own elements, so a read and a write of
the same memory may share a kernel only when they touch the same element: the reader is
pointwise and reads the written tensor directly, at the writer's shape. Any other read
must land in a segment on the right side of the write:

* write-after-read: a node that read the old contents before the write (program order)
  must not run after it, so the write cannot join a segment older than that reader;
* read-after-write: a node that reads the memory after the write, other than through the
  write's own result at the same element, must run in a later segment;
* reads through values computed in the kernel: a kernel does not store a value it computes
  for its own consumers, it computes it again wherever they need it. A slice, a
  reduction or a view of ``r = x * 2`` in the kernel that writes ``x`` therefore reads ``x``
  at other elements, so it may not share that kernel with the write, whichever comes first
  (pointwise consumers of ``r`` at the write's shape read the element their thread owns).
"""

from __future__ import annotations

from thunder_fuser.functionalize import storage_roots
from thunder_fuser.ir.ops import kind_of
from thunder_fuser.ir.region import Node, Region, Value


class WriteHazards:
    def __init__(self, region: Region):
        self.root = storage_roots(region)
        self.written_roots = {id(self.root[id(n.written)]) for n in region.writes()}
        # values that name the written memory itself, element for element (not a view)
        self.direct = {id(v) for v in region.inputs}
        self.direct |= {id(n.output) for n in region.writes()} | {id(n.written) for n in region.writes()}
        self.readers: dict[int, list[tuple[Node, object]]] = {}  # root -> placed (reader, segment)
        self.writes: dict[int, list[tuple[Node, object]]] = {}  # root -> placed (write, segment)
        # value id -> (segment, written roots it was computed from inside that segment)
        self.derived: dict[int, tuple[object, frozenset]] = {}
        # root -> segments holding a node that reads a value derived from it at other elements
        self.shifted: dict[int, list[object]] = {}

    def _read_roots(self, node: Node) -> list[tuple[Value, int]]:
        vals = node.tensor_inputs()
        if node.op in ("copy_", "copy_to_out_"):
            vals = [v for v in vals if v is not node.written]
        return [(v, id(self.root.get(id(v), v))) for v in vals if id(self.root.get(id(v), v)) in self.written_roots]

    @staticmethod
    def _aligned(node: Node, v: Value, shape) -> bool:
        """Does ``node`` read ``v`` at the element its thread writes: pointwise, ``v`` at the
        written shape, and that shape its own (a 0-d value written and read beside a tensor
        is one element every thread reads, and writes)."""
        return kind_of(node.op) in ("pointwise", "write") and v.shape == tuple(shape) == tuple(node.outputs[0].shape)

    def _derived_roots(self, node: Node, seg) -> list[tuple[Value, int]]:
        """(value, root) for each input of ``node`` computed in ``seg`` from a written root."""
        out = []
        for v in node.tensor_inputs():
            hit = self.derived.get(id(v))
            if hit is not None and hit[0] is seg:
                out.extend((v, r) for r in hit[1])
        return out

    def _shifted_reads(self, node: Node, seg, derived=None) -> set[int]:
        """Written roots that ``node`` in ``seg`` would read at elements other than its own
        (``derived``: its ``_derived_roots``, where the caller has them)."""
        return {r for v, r in (self._derived_roots(node, seg) if derived is None else derived)
                if not (kind_of(node.op) in ("pointwise", "write") and v.shape == node.outputs[0].shape)}

    def conflict(self, node: Node, seg, seg_of) -> str | None:
        for r in self._shifted_reads(node, seg):
            if any(wseg is seg for _, wseg in self.writes.get(r, [])):
                return f"{node.op} would read the memory written in place in this kernel at other elements"
        for v, r in self._read_roots(node):
            placed = self.writes.get(r, [])
            if not placed:
                continue
            latest, lseg = placed[-1]
            if lseg is seg and not (v is latest.output and self._aligned(node, v, latest.output.shape)):
                return f"{node.op} reads {v.name} after the in-place write {latest.output.name}; needs that write to land first"
            if any(wseg.index > seg.index for _, wseg in placed):
                return f"{node.op} reads {v.name} after the in-place write {latest.output.name}"
        if node.op in ("copy_", "copy_to_out_"):
            dst = node.written
            r = id(self.root.get(id(dst), dst))
            if any(s is seg for s in self.shifted.get(r, [])):
                return f"the write into {dst.name} would race with a read of values computed from it at other elements"
            for reader, rseg in self.readers.get(r, []):
                if rseg.index > seg.index:
                    return f"the write into {dst.name} must follow {reader.op} that reads its old contents"
                # an earlier read of the same element in the same thread happens before the store
                if rseg is seg and not all(
                    self._aligned(reader, v, dst.shape) and id(v) in self.direct
                    for v, rr in self._read_roots(reader)
                    if rr == r
                ):
                    return f"the write into {dst.name} would race with {reader.op} reading it at other elements"
        return None

    def placed(self, node: Node, seg) -> None:
        read = [r for _, r in self._read_roots(node)]
        derived = self._derived_roots(node, seg)
        for r in self._shifted_reads(node, seg, derived):
            self.shifted.setdefault(r, []).append(seg)
        for r in read:
            self.readers.setdefault(r, []).append((node, seg))
        roots = frozenset(read) | {r for _, r in derived}
        if roots and node.op not in ("copy_", "copy_to_out_"):
            for o in node.outputs:
                self.derived[id(o)] = (seg, roots)
        if node.op in ("copy_", "copy_to_out_"):
            dst = node.written
            self.writes.setdefault(id(self.root.get(id(dst), dst)), []).append((node, seg))
