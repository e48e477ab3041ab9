"""Two launches for reductions no block can finish alone: partials, then a finalize.

A column reduction, a row split across blocks, and a row kernel's sums per column each
write one partial per split of the reduced extent into an fp32 workspace
``[splits, reductions * N]`` (no atomics; ``columns_geometry.column_state_offsets`` places
each reduction's block of it); a second launch, the finalize, combines the splits per
column in a fixed order, so results are the same from run to run. A var's partials are a
mean and a sum of squared deviations, merged by Chan's rule.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from thunder_fuser.backends.cute.dsl.cute_memory import operand_views, row_evaluator, store_scalar_if
from thunder_fuser.backends.cute.dsl.cute_reduce import COMBINE, IDENTITY
from thunder_fuser.backends.cute.dsl.cute_values import cast, result_as
from thunder_fuser.backends.cute.kernel_names import named
from thunder_fuser.backends.cute.tiling.geometry import Geometry


@cute.jit
def groups_to_workspace(acc: cute.Tensor, buf: cute.Tensor, ws: cute.Tensor, tidx, split, col0, offset, N,
                         V: cutlass.Constexpr, CW: cutlass.Constexpr, RG: cutlass.Constexpr,
                         combine: cutlass.Constexpr):
    """The block's row groups combined through shared memory; thread t then writes the
    partial of column ``col0 + t`` for this split (coalesced). The buffer is shared by all
    reductions: the first barrier waits for the previous one's readers."""
    cl = tidx % CW
    rg = tidx // CW
    cute.arch.sync_threads()
    for k in cutlass.range_constexpr(V):
        buf[k + V * cl + V * CW * rg] = acc[k]
    cute.arch.sync_threads()
    if tidx < V * CW:
        v = buf[tidx]
        for g in cutlass.range(1, RG):
            v = combine(v, buf[tidx + V * CW * g])
        if col0 + tidx < N:
            ws[(split, offset + col0 + tidx)] = v


# The finalize reads each column's partials of 100+ splits. One thread per column walking
# them all was latency-bound: 4-16 blocks, 21-39 us each in the GPT block's backward
# (H100, ncu). Then a warp per column, each lane walking every 32nd split: but a warp's
# load then touched 32 splits of one column, 32 sectors for 128 useful bytes, and the
# finalize of a bias gradient still took 6.0 us against Inductor's 2.2 (torch.profiler,
# sum(0) of bf16 [262144, 256], 1056 splits); more loads in flight per lane did not help.
# Now a block of FINALIZE_THREADS takes FINALIZE_COLUMNS consecutive columns, one per lane
# of each group of FINALIZE_COLUMNS lanes (a split's 32 bytes: one sector), and its
# FINALIZE_THREADS // FINALIZE_COLUMNS groups walk every group-th split. A thread loads
# FINALIZE_BATCH splits at a time with no branch between the loads (an index past the end
# reads the last split and is masked to the identity), so they are in flight together.
# The groups then merge through shuffles within a warp and shared memory across warps
# (``_across_groups``). H100, scripts/column_probe.py, ms: the bias gradient above 0.057 ->
# 0.053 (its finalize 3 us; torch.compile 0.0526), var_mean of NHWC bf16 [64, 256, 56, 56]
# 0.053 -> 0.051, sum(0) of [65536, 1024] 0.053 -> 0.052. Blocks of 256 threads, 16
# columns, or 16 splits in flight per thread ran within 2% of these; blocks of 1024 slower.
FINALIZE_THREADS = 512


FINALIZE_COLUMNS = 8


FINALIZE_BATCH = 8


def _groups() -> int:
    """Groups of FINALIZE_COLUMNS threads in a finalize block (read when a kernel is traced,
    so that a probe may patch the constants)."""
    return FINALIZE_THREADS // FINALIZE_COLUMNS


def _split_batch(ws: cute.Tensor, s0, col, fill):
    """Column ``col`` of splits ``s0, s0 + _groups(), ...`` (FINALIZE_BATCH of them),
    all loaded before any is used, with no branch between the loads: a split past the end
    reads the last one and comes out as ``fill``. Traced inline (a Python loop, unrolled)."""
    S = cute.size(ws, mode=[0])
    xs = [ws[(cutlass.min(s0 + k * _groups(), S - 1), col)] for k in range(FINALIZE_BATCH)]
    return [cutlass.select_(s0 + k * _groups() < S, x, fill) for k, x in enumerate(xs)]


def _across_groups(values: list, merge, tidx) -> list:
    """A column's values (fp32 scalars, one list per thread) merged over the block's
    groups: butterfly shuffles between the groups of a warp, then shared memory between
    warps, merged in warp order. Every thread of the column ends with the same result, the
    same from run to run. Traced inline; every thread of the block must call it."""
    CL = FINALIZE_COLUMNS
    k = CL
    while k < 32:
        values = merge(values, [cute.arch.shuffle_sync_bfly(v, offset=k) for v in values])
        k *= 2
    warps = FINALIZE_THREADS // 32
    if warps == 1:
        return values
    smem = cutlass.utils.SmemAllocator()
    bufs = [smem.allocate_tensor(cutlass.Float32, cute.make_layout((warps, CL), stride=(CL, 1))) for _ in values]
    c = tidx % CL
    # lanes of one column in a warp may hold results merged in other orders (Chan's merge is
    # not symmetric): the warp's first group writes
    for buf, v in zip(bufs, values):
        store_scalar_if(buf, tidx // 32, c, v, tidx % 32 < CL)
    cute.arch.sync_threads()
    values = [buf[(0, c)] for buf in bufs]
    for w in range(1, warps):
        values = merge(values, [buf[(w, c)] for buf in bufs])
    return values


@cute.jit
def _combine_splits(ws: cute.Tensor, col, group, pred: cutlass.Boolean, combine: cutlass.Constexpr,
                    identity: cutlass.Constexpr):
    v = cutlass.Float32(identity)
    if pred:
        for s0 in cutlass.range(group, cute.size(ws, mode=[0]), _groups() * FINALIZE_BATCH):
            for x in _split_batch(ws, s0, col, cutlass.Float32(identity)):
                v = combine(v, x)
    return v


@cute.jit
def _sum_splits(ws: cute.Tensor, col, group, pred: cutlass.Boolean):
    """The group's splits' partial sums, Kahan-compensated: hundreds of splits added one
    after the other would each round at the size of the whole sum. Infinities sum as
    eager's do (inf, or NaN for inf + -inf)."""
    v = cutlass.Float32(0.0)
    lost = cutlass.Float32(0.0)
    if pred:
        for s0 in cutlass.range(group, cute.size(ws, mode=[0]), _groups() * FINALIZE_BATCH):
            for x in _split_batch(ws, s0, col, cutlass.Float32(0.0)):
                y = x - lost
                t = v + y
                # an infinite sum carries no rounding to compensate ((inf - v) - y is NaN)
                lost = cutlass.select_(t - t == 0.0, (t - v) - y, cutlass.Float32(0.0))
                v = t
    return v - lost


@cute.jit
def _chan(na, ma, qa, nb, mb, qb):
    """Chan et al.'s merge of two (count, mean, sum of squared deviations) summaries."""
    n = na + nb
    w = cutlass.select_(n > 0, nb / cutlass.max(n, cutlass.Float32(1.0)), cutlass.Float32(0.0))
    delta = mb - ma
    return n, ma + delta * w, qa + qb + delta * delta * na * w


@cute.jit
def welford_groups_to_workspace(mean: cute.Tensor, m2: cute.Tensor, buf_mean: cute.Tensor, buf_m2: cute.Tensor,
                                 ws: cute.Tensor, tidx, split, col0, offset, rows, N,
                                 V: cutlass.Constexpr, CW: cutlass.Constexpr, RG: cutlass.Constexpr):
    """var's partial: the row groups' (mean, M2) merged with their row counts; writes the
    split's mean at ``offset`` and its M2 at ``offset + N``."""
    cl = tidx % CW
    rg = tidx // CW
    cute.arch.sync_threads()
    for k in cutlass.range_constexpr(V):
        buf_mean[k + V * cl + V * CW * rg] = mean[k]
        buf_m2[k + V * cl + V * CW * rg] = m2[k]
    cute.arch.sync_threads()
    if tidx < V * CW:
        na = cutlass.Float32(0.0)
        ma = cutlass.Float32(0.0)
        qa = cutlass.Float32(0.0)
        for g in cutlass.range(RG):
            nb = ((rows - g + RG - 1) // RG).to(cutlass.Float32)  # rows group g walked
            na, ma, qa = _chan(na, ma, qa, nb, buf_mean[tidx + V * CW * g], buf_m2[tidx + V * CW * g])
        if col0 + tidx < N:
            ws[(split, offset + col0 + tidx)] = ma
            ws[(split, offset + N + col0 + tidx)] = qa


@cute.jit
def _welford_splits(ws: cute.Tensor, col, group, N, M, per, pred: cutlass.Boolean):
    """The group's splits' summaries (count, mean, M2) merged one after the other, their
    means taken relative to the first split's, so that a large mean does not round at
    every merge."""
    na = cutlass.Float32(0.0)
    ma = cutlass.Float32(0.0)
    qa = cutlass.Float32(0.0)
    if pred:
        base = ws[(0, col)]
        for s0 in cutlass.range(group, cute.size(ws, mode=[0]), _groups() * FINALIZE_BATCH):
            means = _split_batch(ws, s0, col, cutlass.Float32(0.0))
            m2s = _split_batch(ws, s0, col + N, cutlass.Float32(0.0))
            for k in cutlass.range_constexpr(FINALIZE_BATCH):
                # rows of split s: none past the end (s * per >= M there), so it merges nothing
                rows = cutlass.max(cutlass.min(per, M - (s0 + k * _groups()) * per), 0)
                na, ma, qa = _chan(na, ma, qa, rows.to(cutlass.Float32), means[k] - base, m2s[k])
    return na, ma, qa


def finalize_column(per_column: list, geo: Geometry, reduces, offsets, t2s, ws, M, N, per, c, group, tidx) -> None:
    """Column ``c``'s values, from its partials in the workspace: ``reduces`` combined
    (``combined_splits``), then each of the ``per_column`` stores, ``(store, slot)``,
    computed from them and stored by the first group."""
    ok = c < N
    values = combined_splits(reduces, offsets, ws, N, c, group, tidx, M, per, ok)
    ev = row_evaluator(geo, t2s, 0, c, ok, lambda e: values[id(e)])
    for st, slot in per_column:
        store_scalar_if(t2s[slot], 0, c, cast(ev.ev(st.expr), geo.operands[slot].dtype), ok & (group == 0))


def combined_splits(reduces, offsets, ws, width, c, group, tidx, count, per, pred) -> dict:
    """Per reduction (by id), its result for column ``c`` of the workspace's blocks of
    ``width`` (a column of a column reduction, a row of split rows): the splits' partials
    combined by the block's groups (``_across_groups``); ``count`` elements reduced in all,
    ``per`` of them per split (var's merges weigh each split by its count)."""
    values = {}
    for e, offset in zip(reduces, offsets):
        col = offset * width + c
        if e.op == "var":
            summary = _welford_splits(ws, col, group, width, count, per, pred)
            _, _, m2 = _across_groups(list(summary), lambda a, b: list(_chan(*a, *b)), tidx)
            r = m2 / (count.to(cutlass.Float32) - e.correction)
        else:
            combine = COMBINE[e.op]
            if e.op in ("sum", "mean"):
                part = _sum_splits(ws, col, group, pred)
            else:
                part = _combine_splits(ws, col, group, pred, combine, IDENTITY[e.op])
            (r,) = _across_groups([part], lambda a, b: [combine(a[0], b[0])], tidx)
            if e.op == "mean":
                r = r / count.to(cutlass.Float32)
        values[id(e)] = result_as(r, e.dtype)
    return values


def partials_then_finalize(geo: Geometry, rank: int, ref_slot: int, T: int, partial_body, finalize_body, partial_grid,
                            finalized, label: tuple):
    """The two launches of a reduction split across blocks: ``partial_body(t2s, tvs, ws, M,
    N, per, tidx, block x, block y)`` over ``partial_grid(ws, M, N)`` in blocks of ``T``,
    then ``finalize_body(t2s, ws, M, N, per, c, group, tidx)`` for each of ``finalized(M,
    N)`` results ``c``, FINALIZE_COLUMNS of them per block of FINALIZE_THREADS. ``label``:
    the family and programs the kernels are named after (``kernel_names.named``)."""
    V = geo.vector

    @cute.kernel
    def partial(t2s, tvs, ws: cute.Tensor, M: cutlass.Int32, N: cutlass.Int32, per: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        partial_body(t2s, tvs, ws, M, N, per, tidx, bx, by)

    @cute.kernel
    def finalize(t2s, ws: cute.Tensor, M: cutlass.Int32, N: cutlass.Int32, per: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        c = bidx * FINALIZE_COLUMNS + tidx % FINALIZE_COLUMNS
        finalize_body(t2s, ws, M, N, per, c, tidx // FINALIZE_COLUMNS, tidx)

    named(partial, *label)
    named(finalize, *label)

    @cute.jit
    def launch(ts, ws: cute.Tensor, per: cutlass.Int32, stream):
        t2s, tvs, M, N = operand_views(ts, geo, rank, V, ref_slot)
        partial(t2s, tvs, ws, M, N, per).launch(grid=partial_grid(ws, M, N), block=[T, 1, 1], stream=stream)
        finalize(t2s, ws, M, N, per).launch(grid=[(finalized(M, N) + FINALIZE_COLUMNS - 1) // FINALIZE_COLUMNS, 1, 1],
                                            block=[FINALIZE_THREADS, 1, 1], stream=stream)

    return launch


def fake_workspace():
    """The column kernels' fp32 workspace ``[splits, reductions * N]``, extents symbolic."""
    return make_fake_tensor(cutlass.Float32, (cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1),
                            assumed_align=4)
