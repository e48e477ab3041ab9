"""The split-row family: a few long rows (a whole-tensor sum, a loss), each split across one
wave of blocks, since one block streams only 65-100 GB/s on an H100.

Each block reduces its stretch of the row into partials of the workspace, and the
finalize of ``partials.py`` combines them (var from sums of x - c and (x - c)^2, c a sample
of the split). The split counts are computed in ``rows_geometry.row_splits``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch

from thunder_fuser.backends.cute.dsl.cute_memory import (
    for_range,
    fragment,
    loaded_batch,
    row_coord,
    store_row_values,
    store_scalar_if,
    store_vector,
    streamed_loads,
    unroll,
    vector_evaluator,
)
from thunder_fuser.backends.cute.dsl.cute_reduce import (
    COMBINE,
    IDENTITY,
    VECTOR_OP,
    across_threads,
    shared_accumulators,
)
from thunder_fuser.backends.cute.dsl.cute_values import as_vector
from thunder_fuser.backends.cute.families.partials import combined_splits, partials_then_finalize
from thunder_fuser.backends.cute.lower.expr import Program, reductions_in_order
from thunder_fuser.backends.cute.tiling.columns_geometry import column_state_offsets
from thunder_fuser.backends.cute.tiling.geometry import Geometry
from thunder_fuser.backends.cute.unsupported import Unsupported


def build_split_rows(prog: Program, geo: Geometry):
    """Few long rows (a loss's mean, a norm over a whole tensor; ``rows_geometry.SPLIT_MIN``),
    each split across blocks, in two launches and no atomics, as the column reductions run.
    The first: one block per split of a row (grid ``(splits, M)``); its threads walk the
    split's vectors, store the full-domain values on the way (none of them uses a reduction)
    and reduce each reduction over the split in fp32, in one walk (var: see ``partial_body``). Thread
    0 writes the block's partials into the workspace ``[splits, states * M]``, laid out as a
    column reduction's with rows for columns. The second combines each row's splits with
    the column finalize's helpers (Kahan sums, Chan's merges of
    (count, mean, M2)) and store the per-row values."""
    V, T = geo.vector, geo.row_threads
    warps = T // 32
    rank = len(geo.outer) + 1
    ops = geo.operands
    ref_slot = next((s for s, st in zip(geo.store_slot, prog.stores) if not st.is_row), geo.store_slot[0])
    reduces = reductions_in_order(prog)
    offsets = column_state_offsets(reduces)  # each reduction's first workspace block of M
    full = [(st, slot) for st, slot in zip(prog.stores, geo.store_slot) if not st.is_row]
    first_op = {id(e): ("sum" if e.op in ("mean", "var") else e.op) for e in reduces}
    streamed = streamed_loads([e.arg for e in reduces] + [st.expr for st, _ in full])

    def no_row_value(e):
        raise Unsupported("a reduction inside another's argument in a split row")

    def partial_body(t2s, tvs, ws, M, N, per, tidx, split, r):
        m = row_coord(t2s[ref_slot], r, rank)
        ok = r < M
        j0 = split * per
        j1 = cutlass.min(N // V, j0 + per)
        count = ((j1 - j0) * V).to(cutlass.Float32)
        # per reduction, the sums a thread keeps: var's are of (x - c) and (x - c)**2, with
        # c the split's first value of its argument, the same for every thread so that the
        # block's sums add; with c a sample of the data, c + mean(x - c) and
        # sum((x - c)**2) - sum(x - c)**2 / count do not cancel as plain sums of x and x**2
        # would for a mean large beside the spread
        terms = []  # (reduction index, op, transform of the argument's fp32 vector)
        c_of = {}
        for i, e in enumerate(reduces):
            if e.op == "var":
                first = fragment((1, V), torch.float32)
                first.store(as_vector(vector_evaluator(geo, t2s, tvs, m, j0, N, ok, no_row_value).ev(e.arg), V,
                                    torch.float32))
                c = c_of[id(e)] = first[0]
                terms += [(i, "sum", lambda x, c=c: x - c), (i, "sum", lambda x, c=c: (x - c) * (x - c))]
            else:
                terms.append((i, first_op[id(e)], lambda x: x))
        accs = []
        for _, op, _ in terms:
            a = fragment((1, 1), torch.float32)
            a.fill(IDENTITY[op])
            accs.append(a)

        def step(j):
            for ev, _, jj, pred in loaded_batch(geo, t2s, tvs, m, j, (0, T), ok, j1, N, streamed, no_row_value):
                for st, slot in full:
                    store_vector(ev.ev(st.expr), ops[slot], t2s[slot], tvs[slot], m, jj, V, N, pred)
                for (i, op, f), a in zip(terms, accs):
                    v = f(as_vector(ev.ev(reduces[i].arg), V, torch.float32)).reduce(VECTOR_OP[op], IDENTITY[op], 0)
                    a[0] = COMBINE[op](a[0], cutlass.select_(pred, v, cutlass.Float32(IDENTITY[op])))

        for_range(j0 + tidx, j1, T * unroll(geo), step)
        smem = iter(shared_accumulators(T, warps, len(terms) + 1))
        sums = [across_threads(a[0], op, tidx, T, warps, smem) for (_, op, _), a in zip(terms, accs)]
        it = iter(sums)
        for e, offset in zip(reduces, offsets):
            first_ok = ok & (tidx == 0)
            if e.op == "var":
                s1, s2 = next(it), next(it)
                store_scalar_if(ws, split, offset * M + r, c_of[id(e)] + s1 / count, first_ok)
                # rounding could leave a split of nearly equal values a negative M2, and the
                # variance below zero (a NaN standard deviation)
                m2 = cutlass.max(s2 - s1 * s1 / count, cutlass.Float32(0.0))
                store_scalar_if(ws, split, (offset + 1) * M + r, m2, first_ok)
            else:
                store_scalar_if(ws, split, offset * M + r, next(it), first_ok)

    def finalize_body(t2s, ws, M, N, per, r, group, tidx):
        ok = r < M
        values = combined_splits(reduces, offsets, ws, M, r, group, tidx, N, per * V, ok)
        m = row_coord(t2s[ref_slot], cutlass.min(r, M - 1), rank)
        store_row_values(prog, geo, t2s, m, ok & (group == 0), lambda e: values[id(e)])

    return partials_then_finalize(
        geo, rank, ref_slot, T, partial_body, finalize_body, lambda ws, M, N: [cute.size(ws, mode=[0]), M, 1],
        lambda M, N: M, ("split_rows", [prog]))
