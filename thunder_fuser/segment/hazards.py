"""Ordering rules that keep in-place writes correct once nodes are grouped into kernels.

Inside one kernel every thread reads and writes its own elements, so a read and a write of
the same memory may share a kernel only when they touch the same element: the reader is
pointwise and reads the written tensor directly, at the writer's shape. Any other read
must land in a segment on the right side of the write:

* write-after-read: a node that read the old contents before the write (program order)
  must not run after it, so the write cannot join a segment older than that reader;
* read-after-write: a node that reads the memory after the write, other than through the
  write's own result at the same element, must run in a later segment.
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

    def _read_roots(self, node: Node) -> list[tuple[Value, int]]:
        vals = node.tensor_inputs()
        if node.op in ("copy_", "copy_to_out_"):
            vals = [v for v in vals if v is not node.written]
        return [(v, id(self.root.get(id(v), v))) for v in vals if id(self.root.get(id(v), v)) in self.written_roots]

    @staticmethod
    def _aligned(node: Node, v: Value, shape) -> bool:
        return kind_of(node.op) in ("pointwise", "write") and v.shape == tuple(shape)

    def conflict(self, node: Node, seg, seg_of) -> str | None:
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
        for _, r in self._read_roots(node):
            self.readers.setdefault(r, []).append((node, seg))
        if node.op in ("copy_", "copy_to_out_"):
            dst = node.written
            self.writes.setdefault(id(self.root.get(id(dst), dst)), []).append((node, seg))
