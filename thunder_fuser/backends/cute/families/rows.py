"""The row family: reductions and normalizations over rows (softmax, layer and RMS norms,
their backward row parts, sum/amax/amin/mean/var/prod, logsumexp).

``row_threads`` threads hold a whole row in registers (``row_vectors`` vectors each),
reduce thread -> warp (shuffles) -> block (shared memory), and the epilogue reuses the
registers: one read and one write per element. Several rows share a block when a row needs
fewer than 32 threads. A row too long for registers (``rows_geometry.REGISTER_ROW_ELEMENTS``)
is re-read once per reduction and once for the stores, reductions in dependency order, a
softmax's max and sum in one pass (online softmax); its last pass streams its stores and
marks its last reads (``CACHE_HINTS``). Rows of odd length that lie back to back move as
the whole vectors of their flat run, each row's two edge vectors element by element. A row
kernel may also sum per column (a norm backward's weight gradient:
``rows_with_column_sums``). The tiling is computed in ``rows_geometry.py``.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
import torch

from thunder_fuser.backends.cute.tiling.columns_geometry import column_state_offsets
from thunder_fuser.backends.cute.dsl.cute_memory import (
    access_mode,
    element_evaluator,
    flat_view,
    for_range,
    fragment,
    lanes_inside,
    load_vector,
    loaded_batch,
    no_select,
    operand_views,
    row_coord,
    row_evaluator,
    scatter_if,
    shifted_operand,
    store_row_values,
    store_vector,
    streamed_loads,
    unroll,
    vector_evaluator,
)
from thunder_fuser.backends.cute.dsl.cute_reduce import COMBINE, IDENTITY, VECTOR_OP, across_threads, shared_accumulators
from thunder_fuser.backends.cute.dsl.cute_values import (Evaluator, as_vector, cast, cute_where, fast_math_for,
                                               nan_maximum, result_as)
from thunder_fuser.backends.cute.lower.expr import (
    Load,
    Op,
    Program,
    Reduce,
    column_sums,
    dtype_of,
    first_pass,
    has_reduce,
    reductions_in_order,
    softmax_sums,
    subexpressions,
)
from thunder_fuser.backends.cute.tiling.geometry import vector_access
from thunder_fuser.backends.cute.tiling.operands import Geometry
from thunder_fuser.backends.cute.families.partials import finalize_column, partials_then_finalize
from thunder_fuser.backends.cute.tiling.rows_geometry import row_block
from thunder_fuser.backends.cute.kernel_names import named

ONLINE_SOFTMAX = True  # rows too long for registers take a softmax's max and sum in one pass
#                        (``expr.softmax_sums``); False only to measure the two passes beside it
CACHE_HINTS = ("keep", "load", "store")  # a looped row's last pass: its stores stream (st.global.cs),
#   and its loads are the row's last use (ld.global.lu) where ``geo.last_use``
#   (rows_geometry.LOOP_LAST_USE_BYTES); there the passes before it load with an L2 policy
#   of evict-last ("keep"), the lines the last pass reads again; fewer only to measure without them


def _flat_row_edges(rt, Tr: int, V: int, shift, count, N, row_ok) -> list:
    """The chunks of width 1 (element index, predicate, 1) by which a row in registers
    (``build_rows``' ``body``) holds the elements of its flat run's two edge vectors
    (``_flat_row_views``): their 2 * V elements, one per thread, ``rt``, ``rt + Tr``, ...
    Held as whole vectors on two threads, they cost every thread their registers (117
    against 63 per thread for a softmax over rows of 16385 bf16, 512 threads)."""
    chunks = []
    for i in range(-(-2 * V // Tr)):
        e = rt + i * Tr  # the first vector's elements, then the last's
        col = cute_where(e < V, e - shift, (count - 1) * V - shift + (e - V))
        chunks.append((col, row_ok & (e < 2 * V) & (col >= 0) & (col < N), 1))
    return chunks


def _flat_row_views(geo: Geometry, t2s, tvs, m, N):
    """(shift, count, views) of row ``m`` of a flat row kernel (``geometry.flat_rows``): the
    row's first element lies ``shift`` elements into the first of the ``count`` vectors of
    the run that overlap the row, which ``views`` (those of the operands moved a vector at a
    time) index from 0. Vectors 0 and ``count - 1`` are the row's edges."""
    V = geo.vector
    start = cutlass.Int64(m) * N.to(cutlass.Int64)  # the row's first element in the flat run
    lead = start // V
    shift = (start - lead * V).to(cutlass.Int32)
    count = (shift + N + V - 1) // V
    base = cute.assume(lead * V, divby=V)
    views = tuple(flat_view(t2s[s], base, count, V) if vector_access(geo, o) else tvs[s]
                  for s, o in enumerate(geo.operands))
    return shift, count, views


def _row_statistic(e: Reduce, reduce, N, means: dict):
    """The value of reduction ``e`` for one row. ``reduce(op, arg, center)`` reduces ``arg``
    over the row (``(arg - center)**2`` when a center is given), however the template
    holds the row; var is two-pass from the mean, and var_mean's halves share it."""
    if e.op in ("mean", "var"):
        if id(e.arg) not in means:
            means[id(e.arg)] = reduce("sum", e.arg, None) / N.to(cutlass.Float32)
        r = means[id(e.arg)]
        if e.op == "var":
            r = reduce("sum", e.arg, r) / (N.to(cutlass.Float32) - e.correction)
    else:
        r = reduce(e.op, e.arg, None)
    return result_as(r, e.dtype)


def _target_picks(order, geo: Geometry) -> dict:
    """``id(reduction) -> (X, index)`` for the sums over a row of ``where(column == index, X,
    0)`` whose column is an iota 0, 1, ... along the row and whose index is one value per
    row (a cross-entropy's target logit, an nll_loss's log-probability, the target's class
    weight): each is the one element of X at the row's index, read once per row rather than
    compared per element (a compare of 64-bit integers per element cost a looped
    cross-entropy forward over [8192, 128256] bf16 half its time on the H100)."""
    picks = {}
    for e in order:
        if e.op != "sum" or not (isinstance(e.arg, Op) and e.arg.op == "where"):
            continue
        cond, x, other = e.arg.args
        if not (_is_zero(other) and isinstance(cond, Op) and cond.op == "eq") or has_reduce(x):
            continue
        for column, index in (cond.args, cond.args[::-1]):
            if not isinstance(column, Load) or dtype_of(index) not in _INDEX_DTYPES or has_reduce(index):
                continue
            oc = geo.operands[geo.load_slot[id(column)]]
            if oc.iota == (0, 1, 0) and oc.same_every_row and oc.stride[-1] == 1 and _per_row(index, geo):
                picks[id(e)] = (x, index)
                break
    return picks


_INDEX_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _per_row(e, geo: Geometry) -> bool:
    """Does expression ``e`` read only operands that are one value per row (stride 0 along
    the row, no iota)?"""
    loads = [x for x in subexpressions([e]) if isinstance(x, Load)]
    return all(geo.operands[geo.load_slot[id(ld)]].inner_mode == "bcast"
               and geo.operands[geo.load_slot[id(ld)]].iota is None for ld in loads)


def _is_zero(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def _centered(x, center):
    return x if center is None else (x - center) * (x - center)


def build_rows(prog: Program, geo: Geometry):
    """Row reductions: ``row_threads`` threads per row, the row in registers
    (``row_vectors`` vectors per thread) or, for a row too long for registers, re-read from
    global memory once per reduction and once for the stores (``row_vectors == 0``).
    With sums per column (``geo.across``) one wave of blocks walks the rows held in
    registers instead, in two launches (``rows_with_column_sums``)."""
    V, K, Tr = geo.vector, geo.row_vectors, geo.row_threads
    T, rows_per_block = row_block(geo)
    warps = T // 32
    rank = len(geo.outer) + 1
    ops = geo.operands
    ref_slot = next((s for s, st in zip(geo.store_slot, prog.stores) if not st.is_row and not st.across),
                    geo.store_slot[0])
    n_reductions = _count_reductions(prog)
    sums = column_sums(prog)

    def finish(part, op, tidx, acc_iter):
        return across_threads(part, op, tidx, Tr, warps, acc_iter)

    def body(t2s, tvs, m, rt, tidx, N, row_ok, accs, column_accs=()):
        """One row, held in registers; a flat row (``geometry.flat_rows``) as its middle's
        whole vectors and its edge vectors' elements (``_flat_row_edges``). ``column_accs``:
        per sum per column, per vector of the thread's, its fp32 running sum over the rows
        this thread has walked."""
        shift = None
        # per chunk of the thread's: (index, predicate, width): vector ``index`` of the row,
        # or, of width 1, element ``index``
        if geo.flat:  # the middle's whole vectors, then the edge vectors' elements (_flat_row_edges)
            shift, count, tvs = _flat_row_views(geo, t2s, tvs, m, N)
            at = [(1 + rt + c * Tr, row_ok & (1 + rt + c * Tr < count - 1), V) for c in range(K)]
            at += _flat_row_edges(rt, Tr, V, shift, count, N, row_ok)
        else:
            at = [(rt + c * Tr, row_ok & (rt + c * Tr < N // V), V) for c in range(K)]
        chunk_ok = [ok for _, ok, _ in at]

        def shifted(o, width):  # a flat row's weight, element by element in each whole vector
            return shifted_operand(geo, o, shift, False) if width == V else None

        loaded = {}
        row_cache: dict = {}
        means: dict = {}
        acc_iter = iter(accs)

        def load_chunk(c):
            j, ok, width = at[c]

            def load(ld: Load):
                slot = geo.load_slot[id(ld)]
                o = ops[slot]
                per_row = access_mode(o, V) == "bcast"  # a per-row scalar is read once (per chunk width)
                key = (slot, ("row", width) if per_row else c)
                if key not in loaded:
                    loaded[key] = load_vector(o, t2s[slot], tvs[slot], m, j, width, N, row_ok if per_row else ok,
                                               shift=shifted(o, width))
                return loaded[key]
            return load

        chunks = []

        def row_value(e: Reduce):
            if id(e) not in row_cache:
                row_cache[id(e)] = _row_statistic(e, reduce_registers, N, means)
            return row_cache[id(e)]

        def reduce_registers(op, arg, center):
            identity = cutlass.Float32(IDENTITY[op])
            part = identity
            for c, ch in enumerate(chunks):
                r = _centered(cast(ch.ev(arg), torch.float32), center).reduce(VECTOR_OP[op], IDENTITY[op], 0)
                part = COMBINE[op](part, cutlass.Float32(cutlass.select_(chunk_ok[c], r, identity)))
            return finish(part, op, tidx, acc_iter)

        for c in range(len(at)):
            chunks.append(Evaluator(load_chunk(c), row_value, no_select))
        for e, accs_of_sum in zip(sums, column_accs):
            for c, acc in enumerate(accs_of_sum):
                acc.store(acc.load() + cute_where(chunk_ok[c], as_vector(chunks[c].ev(e.arg), V, torch.float32), 0.0))
        store_row_values(prog, geo, t2s, m, row_ok & (rt == 0), row_value)
        for st, slot in zip(prog.stores, geo.store_slot):
            if not st.is_row and not st.across:
                for c, (j, ok, width) in enumerate(at):
                    store_vector(chunks[c].ev(st.expr), ops[slot], t2s[slot], tvs[slot], m, j, width, N, ok,
                                  shift=shifted(ops[slot], width))

    def body_looped(t2s, tvs, m, rt, tidx, N, row_ok, accs):
        """One row per block of ``Tr`` threads; thread ``rt`` visits vectors rt, rt+Tr, ...
        in every pass, ``unroll`` of them per loop step (``loaded_batch``). Reductions
        run in dependency order (softmax: max, then the sum of exp(x - max)); a later pass
        reads the earlier results as row scalars. Flat rows (``geometry.flat_rows``): the
        loop walks the whole vectors inside the row, and threads 0 and 1 its edge vectors,
        shared with the rows before and after, element by element (``walk``)."""
        acc_iter = iter(accs)
        values: dict = {}
        first_hint = "keep" if geo.last_use and "keep" in CACHE_HINTS else None  # the passes before the last
        shift = None  # flat rows: elements of the row before in the row's first vector
        first, end = 0, N // V  # the vectors the loop walks
        if geo.flat:
            shift, count, tvs = _flat_row_views(geo, t2s, tvs, m, N)
            first, end = 1, count - 1

        def batch(j, roots, hint=None, inside=False):
            return loaded_batch(geo, t2s, tvs, m, j, (0, Tr), row_ok, None if inside else end, N,
                                 streamed_loads(roots), lambda e: values[id(e)], hint, shift)

        def walk(roots, absorb, hint=None):
            """``absorb(vectors, edge_shift)`` for every step of this thread's walk of the
            row: ``vectors`` = [(evaluator, vector index, where its elements are the row's)],
            the last a predicate, or one per element for an edge vector (``edge_shift``: the
            row's shift there, None in the middle)."""

            def step(j, inside=False):
                absorb([(ev, jj, pred) for ev, _, jj, pred in batch(j, roots, hint, inside)], None)

            # the steps whose vectors all lie inside the row take no predicate and mask
            # nothing (a select per element costs a long row's online softmax a fifth of its
            # instructions); the one step after them, partly past the row's end, is masked
            stride, reach = Tr * unroll(geo), Tr * (unroll(geo) - 1)
            start = rt + first
            inside_end = cutlass.Int32(cutlass.select_(row_ok, end - reach, start))
            for_range(start, inside_end, stride, lambda j: step(j, True))
            rest = start + cutlass.max(0, (inside_end - start + stride - 1) // stride) * stride
            for_range(rest, end, stride, step)
            if shift is not None:
                def edge(i):  # i = 0: the row's first vector, 1: its last
                    jj = i * (count - 1)
                    ev = vector_evaluator(geo, t2s, tvs, m, jj, N, row_ok, lambda e: values[id(e)], shift=shift,
                                           edge=True)
                    for ld in streamed_loads(roots):
                        ev.ev(ld)
                    absorb([(ev, jj, lanes_inside(jj * V - shift, N, row_ok, V))], shift)

                for_range(rt, 2, Tr, edge)

        def reduce_pass(op, arg, center):
            acc = fragment((1, V), torch.float32)
            acc.fill(IDENTITY[op])

            def absorb(vectors, _):
                for ev, _, keep in vectors:
                    x = _centered(as_vector(ev.ev(arg), V, torch.float32), center)
                    acc.store(COMBINE[op](acc.load(), cute_where(keep, x, IDENTITY[op])))

            walk([arg], absorb, first_hint)
            return finish(acc.load().reduce(VECTOR_OP[op], IDENTITY[op], 0), op, tidx, acc_iter)

        def online_state():
            """A thread's running max (``top``) and its vector of sums of exp(x - max)."""
            top = fragment((1, 1), torch.float32)
            top.fill(-math.inf)
            acc = fragment((1, V), torch.float32)
            acc.fill(0.0)
            return top, acc

        def absorb_online(top, acc, x_expr, vectors):
            """Fold one batch of vectors into the running max and sum: the sum is rescaled when
            the max grows (once per batch)."""
            xs = [cute_where(keep, as_vector(ev.ev(x_expr), V, torch.float32), -math.inf) for ev, _, keep in vectors]
            most = xs[0]
            for x in xs[1:]:
                most = nan_maximum(most, x)
            new = nan_maximum(top[0], most.reduce(cute.ReductionOp.MAX, -math.inf, 0))
            shift = _finite_or_zero(new)
            total = acc.load() * _rescale(top[0], shift)
            for x in xs:
                total = total + _exp_of_at_most_zero(x, shift)
            acc.store(total)
            top[0] = new

        def finish_online(top, acc):
            """(the row's max, its finite shift, the row's sum of exp(x - shift)): the threads'
            sums rescaled to the row's max, then added."""
            row_max = finish(top[0], "amax", tidx, acc_iter)
            row_shift = _finite_or_zero(row_max)
            mine = acc.load().reduce(cute.ReductionOp.ADD, 0.0, 0) * _rescale(top[0], row_shift)
            return row_max, row_shift, finish(mine, "sum", tidx, acc_iter)

        def online_pass(x_expr):
            """The row's max of ``x_expr`` and its sum of exp(x - max) in one pass."""
            top, acc = online_state()
            walk([x_expr], lambda vectors, _: absorb_online(top, acc, x_expr, vectors), first_hint)
            return finish_online(top, acc)

        def fused_pass(softmax, plain):
            """One walk of the row for several reductions (``expr.first_pass``): a softmax's
            max and sum taken online as ``online_pass`` does (``softmax``: (the sum, the max,
            X, C), or None), and the reductions ``plain`` beside it, each in an fp32
            accumulator of its own."""
            x_expr = softmax[2] if softmax else None
            top, acc = online_state()
            plain_accs = []
            for e in plain:
                a = fragment((1, V), torch.float32)
                a.fill(IDENTITY[e.op])
                plain_accs.append(a)

            def absorb(vectors, _):
                if x_expr is not None:
                    absorb_online(top, acc, x_expr, vectors)
                for e, a in zip(plain, plain_accs):
                    for ev, _, keep in vectors:
                        x = as_vector(ev.ev(e.arg), V, torch.float32)
                        a.store(COMBINE[e.op](a.load(), cute_where(keep, x, IDENTITY[e.op])))

            walk(([x_expr] if x_expr is not None else []) + [e.arg for e in plain], absorb, first_hint)
            if x_expr is not None:
                s, mx, _, center = softmax
                row_max, row_shift, total = finish_online(top, acc)
                values[id(mx)] = row_max
                c = row_evaluator(geo, t2s, m, 0, row_ok, lambda r: values[id(r)]).ev(center)
                values[id(s)] = result_as(total * cute.math.exp(row_shift - c), s.dtype)
            for e, a in zip(plain, plain_accs):
                part = a.load().reduce(VECTOR_OP[e.op], IDENTITY[e.op], 0)
                values[id(e)] = result_as(finish(part, e.op, tidx, acc_iter), e.dtype)

        means: dict = {}
        order = reductions_in_order(prog)
        picks = _target_picks(order, geo)
        for e in order:
            if id(e) in picks:  # one element per row, read by the row's first thread
                x_expr, index = picks[id(e)]
                at = cutlass.Int64(element_evaluator(geo, t2s, m, 0, row_ok, lambda r: values[id(r)]).ev(index))
                inside = row_ok & (rt == 0) & (at >= 0) & (at < cutlass.Int64(N))
                col = cutlass.Int32(cute_where(inside, at, 0))
                x = element_evaluator(geo, t2s, m, col, inside, lambda r: values[id(r)]).ev(x_expr)
                part = cute_where(inside, cutlass.Float32(x), 0.0)
                values[id(e)] = result_as(finish(part, "sum", tidx, acc_iter), e.dtype)
        online: dict = {}  # a max -> its first softmax sum (a second one takes a pass of its own)
        for s, top, x_expr, center in softmax_sums(order) if ONLINE_SOFTMAX else ():
            online.setdefault(id(top), (s, x_expr, center))
        if ONLINE_SOFTMAX:
            softmax, plain = first_pass([e for e in order if id(e) not in picks])
            if plain:
                fused_pass(softmax, plain)
        for e in order:
            if id(e) in values:  # a softmax sum, taken with its max
                continue
            if id(e) not in online:
                values[id(e)] = _row_statistic(e, reduce_pass, N, means)
                continue
            s, x_expr, center = online[id(e)]
            row_max, row_shift, total = online_pass(x_expr)
            values[id(e)] = row_max
            c = row_evaluator(geo, t2s, m, 0, row_ok, lambda r: values[id(r)]).ev(center)
            values[id(s)] = result_as(total * cute.math.exp(row_shift - c), s.dtype)
        store_row_values(prog, geo, t2s, m, row_ok & (rt == 0), lambda e: values[id(e)])
        full = [(st, slot) for st, slot in zip(prog.stores, geo.store_slot) if not st.is_row]
        load_hint = "load" if geo.last_use and "load" in CACHE_HINTS else None
        store_hint = "store" if "store" in CACHE_HINTS else None

        # the last pass of a long row is bound by its instructions (an exact exp is nine per
        # element): where it stores only fp16/bf16, its exps are ex2.approx (``fast_exp``,
        # ``fast_math_for``), whose error is far below their rounding. H100, ncu, the loss's
        # row kernel over bf16 [8192, 128256] (online pass, then the gradient): 928M
        # instructions, issue 57% busy, 64 registers and 26M spill requests, 1.82 ms
        narrow = fast_math_for(ops[slot].dtype for _, slot in full)

        def store(vectors, edge_shift):  # the row's last read, and stores no one reads here: neither should stay in L2
            for ev, jj, keep in vectors:
                ev.fast_math = narrow
                for st, slot in full:  # an edge vector's elements are written where they are the row's
                    store_vector(ev.ev(st.expr), ops[slot], t2s[slot], tvs[slot], m, jj, V, N,
                                  row_ok if edge_shift is not None else keep, hint=store_hint, shift=edge_shift)

        if full:
            walk([st.expr for st, _ in full], store, load_hint)

    if geo.across:
        return rows_with_column_sums(prog, geo, body, ref_slot, n_reductions)
    row_body = body_looped if geo.looped else body

    @cute.kernel
    def kernel(t2s, tvs, M: cutlass.Int32, N: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        m = bidx * rows_per_block + tidx // Tr
        rt = tidx % Tr
        row_body(t2s, tvs, row_coord(t2s[ref_slot], m, rank), rt, tidx, N, m < M,
                 shared_accumulators(Tr, warps, n_reductions))

    named(kernel, "rows", [prog])

    @cute.jit
    def launch(ts, stream):
        t2s, tvs, M, N = operand_views(ts, geo, rank, V, ref_slot)
        blocks = (M + rows_per_block - 1) // rows_per_block
        kernel(t2s, tvs, M, N).launch(grid=[blocks, 1, 1], block=[T, 1, 1], stream=stream)

    return launch


def rows_with_column_sums(prog: Program, geo: Geometry, body, ref_slot: int, n_reductions: int):
    """A row kernel that also sums per column (a norm backward's weight gradient beside its
    input gradient), reading the operands once. The first launch: one wave of blocks walks
    its rows (``per`` row blocks each, consecutive), each row held in registers as
    ``build_rows`` holds it, while each thread adds the vectors of its columns into fp32
    registers; then the block's row slots add theirs through shared memory (rows of a warp
    or less share a block) and the first writes the block's partial row into the workspace
    ``[blocks, sums * N]``. The second adds each column's partials (Kahan) and stores the
    per-column values, as a column reduction's finalize does (``partials_then_finalize``)."""
    V, K, Tr = geo.vector, geo.row_vectors, geo.row_threads
    T, rows_per_block = row_block(geo)
    rank = len(geo.outer) + 1
    sums = column_sums(prog)
    offsets = column_state_offsets(sums)  # each sum's block of N in the workspace's rows

    def add_row_slots(accs, slot, rt):
        """Every row slot's sums added into each thread's ``accs`` (one flat list), through
        shared memory: each slot writes its own, then each thread adds all of its columns'."""
        held = len(accs) * V
        buf = cutlass.utils.SmemAllocator().allocate_tensor(cutlass.Float32, rows_per_block * held * Tr)
        for a, acc in enumerate(accs):
            for k in range(V):
                buf[(slot * held + a * V + k) * Tr + rt] = acc[k]
        cute.arch.sync_threads()
        for a, acc in enumerate(accs):
            for k in range(V):
                total = buf[(a * V + k) * Tr + rt]
                for other in range(1, rows_per_block):
                    total = total + buf[(other * held + a * V + k) * Tr + rt]
                acc[k] = total

    def partial_body(t2s, tvs, ws, M, N, per, tidx, bx, by):
        rt, slot = tidx % Tr, tidx // Tr
        column_accs = []
        for _ in sums:
            column_accs.append([fragment((1, V), torch.float32) for _ in range(K)])
            for acc in column_accs[-1]:
                acc.fill(0.0)
        shared = shared_accumulators(Tr, T // 32, n_reductions)
        row_blocks = (M + rows_per_block - 1) // rows_per_block

        def step(b):
            m = b * rows_per_block + slot
            body(t2s, tvs, row_coord(t2s[ref_slot], m, rank), rt, tidx, N, m < M, shared, column_accs)

        for_range(bx * per, cutlass.min(row_blocks, bx * per + per), 1, step)
        if rows_per_block > 1:  # shared_accumulators allocated nothing (rows of a warp or less)
            add_row_slots([acc for accs in column_accs for acc in accs], slot, rt)
        for offset, accs_of_sum in zip(offsets, column_accs):
            for c, acc in enumerate(accs_of_sum):
                j = rt + c * Tr
                scatter_if(acc, ws, bx, offset * N + j * V, offset * N + N, (slot == 0) & (j < N // V), V)

    per_column = [(st, slot) for st, slot in zip(prog.stores, geo.store_slot) if st.across]

    def finalize_body(t2s, ws, M, N, per, c, group, tidx):
        finalize_column(per_column, geo, sums, offsets, t2s, ws, M, N, per, c, group, tidx)

    return partials_then_finalize(
        geo, rank, ref_slot, T, partial_body, finalize_body,
        lambda ws, M, N: [cute.size(ws, mode=[0]), 1, 1], lambda M, N: N, ("rows_and_columns", [prog]))


def _finite_or_zero(m):
    """What an online softmax subtracts for a running max ``m``: ``m``, or 0 where it is
    infinite (no finite value yet, or a +inf met), so that exp(x - it) is never inf - inf."""
    return cutlass.select_(m == -math.inf, cutlass.Float32(0.0),
                           cutlass.select_(m == math.inf, cutlass.Float32(0.0), m))


def _exp_of_at_most_zero(x, shift):
    """``exp(x - shift)`` for ``x <= shift`` (an online softmax's terms, ``shift`` the running
    max): ``ex2.approx`` of one fused multiply-add. Its error beside ``cute.math.exp``'s
    (which reduces the argument in extra precision, nine instructions per element) is at
    most 2**-24 * |x - shift| * ln 2 relative, so at most about 2**-22 of the sum, whose
    terms near the max dominate; a long row's online softmax is bound by its instructions,
    not its loads, with the exact exp."""
    return cute.math.exp2(x * _LOG2_E - shift * _LOG2_E, fastmath=True)


_LOG2_E = math.log2(math.e)


def _rescale(old, shift):
    """The factor that moves a sum of exp(x - ``_finite_or_zero(old)``) to exp(x - ``shift``)
    (the shift of a max no smaller than ``old``); 0 while ``old`` is -inf (the sum is 0 then,
    and exp(0 - shift) might overflow)."""
    return cutlass.select_(old == -math.inf, cutlass.Float32(0.0), cute.math.exp(_finite_or_zero(old) - shift))


def _count_reductions(prog: Program) -> int:
    """Shared-memory buffers a row kernel needs: two block reductions per reduction over the
    rows (var is a sum, then a sum of squared deviations), plus one. A sum per column takes
    none: each thread keeps its own columns."""
    found = sum(isinstance(e, Reduce) and not e.across for e in subexpressions(st.expr for st in prog.stores))
    return 2 * found + 1
