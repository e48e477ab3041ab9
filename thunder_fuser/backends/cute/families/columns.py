"""The column family: reductions whose kept dims are innermost in memory (a bias gradient,
a channels-last batch norm's statistics).

Two launches (``partials.py``): a block of ``columns_geometry.COLUMN_THREADS`` walks its
split of the reduced extent for ``col_vectors`` column vectors, into fp32 partials of the
workspace (Welford for var, Kahan-summed splits for sums); the finalize combines the
splits per column. The split counts are computed in ``columns_geometry.py``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch

from thunder_fuser.backends.cute.dsl.cute_memory import (
    for_range,
    fragment,
    loaded_batch,
    store_vector,
    streamed_loads,
    unroll,
    vector_evaluator,
)
from thunder_fuser.backends.cute.dsl.cute_reduce import COMBINE, IDENTITY
from thunder_fuser.backends.cute.dsl.cute_values import as_vector, cute_where
from thunder_fuser.backends.cute.families.partials import (
    finalize_column,
    groups_to_workspace,
    partials_then_finalize,
    welford_groups_to_workspace,
)
from thunder_fuser.backends.cute.lower.expr import Program, reductions_in_order
from thunder_fuser.backends.cute.tiling.columns_geometry import COLUMN_THREADS, column_state_offsets
from thunder_fuser.backends.cute.tiling.operands import Geometry
from thunder_fuser.backends.cute.unsupported import Unsupported


def build_columns(prog: Program, geo: Geometry):
    """Column reductions (the kept dims innermost in memory), in two launches and no atomics,
    so the result is deterministic. The first: blocks of ``col_vectors`` column vectors x
    row groups, one grid row per split of the reduced extent; each thread walks its rows,
    stores the full-domain values on the way and accumulates each reduction in fp32
    registers, then the block's row groups combine through shared memory into the split's
    partial in a workspace. The second: groups of a block's threads walk each column's
    splits, merge (``_across_groups``), and the first group computes and stores the
    per-column values."""
    V, CW = geo.vector, geo.col_vectors
    T = COLUMN_THREADS
    RG = T // CW
    rank = len(geo.outer) + 1
    ops = geo.operands
    ref_slot = geo.store_slot[0]
    reduces = reductions_in_order(prog)
    offsets = column_state_offsets(reduces)  # each reduction's first workspace block of N
    full = [(st, slot) for st, slot in zip(prog.stores, geo.store_slot) if not st.is_row]
    per_column = [(st, slot) for st, slot in zip(prog.stores, geo.store_slot) if st.is_row]
    streamed = streamed_loads([e.arg for e in reduces] + [st.expr for st, _ in full])

    def no_row_value(e):
        raise Unsupported("a reduction inside a column reduction's argument")

    def partial_body(t2s, tvs, ws, M, N, per, tidx, bx, split):
        j = bx * CW + tidx % CW
        ok = j < N // V
        start = split * per + tidx // CW  # this thread's first row
        r0 = split * per
        r1 = cutlass.min(M, r0 + per)
        first = vector_evaluator(geo, t2s, tvs, start, j, N, ok & (start < r1), no_row_value)
        accs = []
        for e in reduces:
            if e.op == "var":  # Welford: running mean and sum of squared deviations
                mean, m2 = fragment((1, V), torch.float32), fragment((1, V), torch.float32)
                mean.fill(0.0)
                m2.fill(0.0)
                # the mean runs relative to the thread's first value (rounding then scales
                # with the spread, not the size of the mean), which is added back at the end
                shift = fragment((1, V), torch.float32)
                shift.store(as_vector(first.ev(e.arg), V, torch.float32))
                accs.append((mean, m2, shift))
            else:
                a = fragment((1, V), torch.float32)
                a.fill(IDENTITY[e.op])
                accs.append(a)

        def step(m):
            for ev, mm, _, pred in loaded_batch(geo, t2s, tvs, m, j, (RG, 0), ok, r1, N, streamed, no_row_value):
                for st, slot in full:
                    store_vector(ev.ev(st.expr), ops[slot], t2s[slot], tvs[slot], mm, j, V, N, pred)
                for e, acc in zip(reduces, accs):
                    x = as_vector(ev.ev(e.arg), V, torch.float32)
                    if e.op == "var":
                        mean, m2, shift = acc
                        # one division per row, not per element: the count is the vector's
                        inv = cutlass.Float32(1.0) / ((mm - start) // RG + 1).to(cutlass.Float32)
                        mu = mean.load()
                        x = x - shift.load()
                        d = x - mu
                        mu_next = mu + d * inv
                        mean.store(cute_where(pred, mu_next, mu))
                        m2.store(cute_where(pred, m2.load() + d * (x - mu_next), m2.load()))
                    else:
                        acc.store(COMBINE[e.op](acc.load(), cute_where(pred, x, IDENTITY[e.op])))

        for_range(start, r1, RG * unroll(geo), step)
        smem = cutlass.utils.SmemAllocator()
        bufs = [smem.allocate_tensor(cutlass.Float32, V * T) for _ in range(2)]  # at most 16 KB
        col0 = bx * CW * V
        for e, acc, offset in zip(reduces, accs, offsets):
            if e.op == "var":
                mean, m2, shift = acc
                mean.store(mean.load() + shift.load())
                welford_groups_to_workspace(mean, m2, *bufs, ws, tidx, split, col0, offset * N, r1 - r0, N, V, CW, RG)
            else:
                groups_to_workspace(acc, bufs[0], ws, tidx, split, col0, offset * N, N, V, CW, RG, COMBINE[e.op])

    def finalize_body(t2s, ws, M, N, per, c, group, tidx):
        finalize_column(per_column, geo, reduces, offsets, t2s, ws, M, N, per, c, group, tidx)

    return partials_then_finalize(
        geo, rank, ref_slot, T, partial_body, finalize_body,
        lambda ws, M, N: [(N // V + CW - 1) // CW, cute.size(ws, mode=[0]), 1], lambda M, N: N, ("columns", [prog]))
