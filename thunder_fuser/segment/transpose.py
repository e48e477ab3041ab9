"""Pointwise segments that need the tiled transpose template: some input's fastest dim does
not land on the output's fastest dim, in the layouts a plan chose."""

from __future__ import annotations

from thunder_fuser.ir.region import Region
from thunder_fuser.segment.segmenter import Segment


def _innermost(shape, order) -> int:
    """The fastest-moving dim that has more than one element (size-1 dims have no order)."""
    return next((d for d in reversed(order) if shape[d] > 1), order[-1])


def transpose_segments(segments: list[Segment], region: Region, orders: dict[int, tuple], prov) -> set[int]:
    """Indices of pointwise segments where some input's fastest dim does not land on the
    output's fastest dim (in the output's index space): those need the tiled transpose
    template. A merged output dim is fastest-consistent when the input's fastest dim is the
    inner part of it; where the input's fastest dim is split, its inner part must land on
    the output's fastest dim (its outer parts may go anywhere); size-1 and broadcast dims
    have no order and never count."""
    inputs = {v.name: v for v in region.inputs}
    result = set()
    for seg in segments:
        if seg.kind != "pointwise":
            continue
        for o in seg.outputs:
            if not o.is_tensor or o.ndim < 2 or id(o) not in orders:
                continue
            inner = _innermost(o.shape, orders[id(o)])
            for j, atoms in enumerate(prov.get(id(o), ())):
                for name, idim, part, nparts in atoms:
                    v = inputs.get(name)
                    if v is None or id(v) not in orders or v.numel <= 1 or o.shape[j] <= 1:
                        continue
                    if idim == _innermost(v.shape, orders[id(v)]) and part == nparts - 1 and j != inner:
                        result.add(seg.index)
    return result
