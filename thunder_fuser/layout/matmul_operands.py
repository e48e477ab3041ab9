"""Orders that torch's matmul reads without copying first.

A region output that a matmul reads is worth laying out for the matmul rather than after
the region's inputs. ``torch.matmul`` of two operands of three or more dims reshapes each
one's batch dims into one (a view only where those dims are outermost and dense among
themselves) and hands ``bmm`` matrices in either row- or column-major order; ``linear``,
and ``matmul`` of such an operand beside a matrix, fold every leading dim into the rows. An
operand in any other layout is first copied by torch, element by element: in the GPT
block the scaled q and k and the attention output's gradient, laid out ``[b, s, h, e]``
after the projection they come from, cost ten such copies per step (0.38 ms of 3.1 on the
H100).

The orders below change only what must change: the batch (or folded) dims go outermost
in logical order, and the matrix dims keep the order the input rule chose, so an output's
innermost dim, the one its kernel vectorizes along, stays where it was whenever it is a
matrix dim.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thunder_fuser.ir.region import Region

BATCHED = "batched"  # both operands have 3+ dims: the batch dims merge, then bmm
FOLDED = "folded"  # linear's input, or a 3+-dim matmul operand beside a matrix: leading dims merge


def matmul_order(order: tuple[int, ...], how: str) -> tuple[int, ...]:
    """``order`` (outermost first), changed only as far as ``how`` needs."""
    ndim = len(order)
    if ndim < 3:  # a dense matrix is row- or column-major: mm takes both
        return order
    if how == BATCHED:
        return tuple(range(ndim - 2)) + tuple(d for d in order if d >= ndim - 2)
    lead = tuple(range(ndim - 1))
    return lead + (ndim - 1,) if order[-1] == ndim - 1 else (ndim - 1,) + lead


def matmul_reads(calls) -> dict[str, str]:
    """Tensor name -> how a matmul reads it, from ``(op, operand ranks, operand names)``
    per matmul-like call (``op`` is "matmul" or "linear"); a tensor read two ways keeps the
    first."""
    how: dict[str, str] = {}
    for op, ranks, names in calls:
        if op == "linear":
            if ranks[0] >= 3:
                how.setdefault(names[0], FOLDED)
        elif len(ranks) >= 2 and ranks[0] >= 3 and ranks[1] >= 3:
            how.setdefault(names[0], BATCHED)
            how.setdefault(names[1], BATCHED)
        elif ranks[0] >= 3 and len(ranks) >= 2 and ranks[1] <= 2:
            how.setdefault(names[0], FOLDED)
    return how


def _merge_as_view(shape, strides) -> bool:
    """Whether these dims merge into one without a copy (size-1 dims have no stride)."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    return all(s == dims[i + 1][0] * dims[i + 1][1] for i, (_, s) in enumerate(dims[:-1]))


def _blas_matrix(rows: int, cols: int, row_stride: int, col_stride: int) -> bool:
    """Whether cuBLAS reads this matrix as it is: row- or column-major, rows not overlapping."""
    return (col_stride == 1 and row_stride >= max(1, cols)) or (row_stride == 1 and col_stride >= max(1, rows))


def matmul_copies(shape, strides, how: str) -> bool:
    """Whether torch copies a tensor of these strides before a matmul that reads it ``how``.
    ``at::matmul`` folds an operand's leading dims only where they merge as a view, and
    otherwise takes the batched path, which reshapes the batch dims (a copy unless they
    merge) for ``bmm``; cuBLAS then takes a matrix row- or column-major, and bmm copies any
    other (on the GPU; the CPU's bmm reads any strides)."""
    ndim = len(shape)
    if ndim < 2:
        return False
    if ndim == 2:
        return not _blas_matrix(shape[0], shape[1], strides[0], strides[1])
    if how == FOLDED and _merge_as_view(shape[:-1], strides[:-1]):
        rows = math.prod(shape[:-1])
        inner = [s for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
        if _blas_matrix(rows, shape[-1], inner[-1] if inner else 1, strides[-1]):
            return False
    batched = _merge_as_view(shape[:-2], strides[:-2])
    return not (batched and _blas_matrix(shape[-2], shape[-1], strides[-2], strides[-1]))


def lay_out_for_matmuls(region: Region, orders: dict, fresh: set[int]) -> list[str]:
    """Lay out each output the plan allocates for the matmul that reads it, where one does;
    a line per output whose order this changed."""
    notes = []
    for o in region.outputs:
        how = region.matmul_reads.get(o.name)
        if how is not None and id(o) in fresh and id(o) in orders:
            new = matmul_order(orders[id(o)], how)
            if new != orders[id(o)]:
                notes.append(f"output {o.name} in order {new}, not {orders[id(o)]}: a {how} matmul reads it")
            orders[id(o)] = new
    return notes
