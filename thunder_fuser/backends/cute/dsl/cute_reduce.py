"""Reductions across a kernel's lanes: per vector, thread -> warp (shuffles) -> block (shared
memory), NaN-propagating like torch. Shared by the row, split-row and column families.
"""

from __future__ import annotations

import math
import operator

import cutlass
import cutlass.cute as cute

from thunder_fuser.backends.cute.dsl.cute_values import nan_maximum, nan_minimum


@cute.jit
def _block_reduce(val, acc: cute.Tensor, tidx, warps: cutlass.Constexpr, combine: cutlass.Constexpr,
                  identity: cutlass.Constexpr):
    warp = tidx // 32
    lane = tidx % 32
    if lane == 0:
        acc[warp] = val
    cute.arch.sync_threads()
    if warp == 0:
        v = acc[lane] if lane < warps else cutlass.Float32(identity)
        v = cute.arch.warp_reduction(v, combine)
        if lane == 0:
            acc[warps] = v
    cute.arch.sync_threads()
    return acc[warps]


# per reduction: the in-vector reduction, the combine of two fp32 values or vectors
# (NaN-propagating, like torch; threads, warps, blocks and splits all use it) and the identity
VECTOR_OP = {"sum": cute.ReductionOp.ADD, "amax": cute.ReductionOp.MAX, "amin": cute.ReductionOp.MIN,
              "prod": cute.ReductionOp.MUL}


COMBINE = {"sum": operator.add, "mean": operator.add, "amax": nan_maximum, "amin": nan_minimum, "prod": operator.mul}


IDENTITY = {"sum": 0.0, "mean": 0.0, "amax": -math.inf, "amin": math.inf, "prod": 1.0}


def across_threads(part, op: str, tidx, Tr: int, warps: int, acc_iter):
    """A thread's partial of ``op`` reduced over the row's ``Tr`` threads: shuffles within a
    warp, then shared memory (the next of ``acc_iter``'s buffers) across the block's warps."""
    part = cute.arch.warp_reduction(part, COMBINE[op], threads_in_group=min(Tr, 32))
    if Tr > 32:
        part = _block_reduce(part, next(acc_iter), tidx, warps, COMBINE[op], IDENTITY[op])
    return part


def shared_accumulators(Tr, warps, count):
    if Tr <= 32:
        return []
    smem = cutlass.utils.SmemAllocator()
    return [smem.allocate_tensor(cutlass.Float32, warps + 1) for _ in range(count)]
