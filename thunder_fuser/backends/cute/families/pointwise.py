"""The pointwise family: one thread per vector of ``V`` elements along ``N``.

128-bit loads and stores for stride-1 operands, one scalar load for stride-0 (broadcast)
operands, ``V`` scalar loads for any other stride. Without outer dims a ragged ``N``
predicates the last vector, element by element. cat/pad picks a piece per vector along
``N`` or, along an outer dim (placed outermost), per row. Where loaded operands are
broadcast along an outer mode, a thread walks ``pointwise_geometry.REUSE_ROWS`` rows of it
and loads them once (RoPE's cos/sin over the heads). Rows of odd length that lie back to
back move as the whole vectors of their flat run (``_flat_pointwise_pieces``). Independent
pointwise programs may share one launch (``build_pointwise_group``). An operand contiguous
across the rows is staged instead (``staged.py``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from thunder_fuser.backends.cute.dsl.cute_memory import (
    coord_entry,
    flat_view,
    fragment,
    iota_value,
    iota_at,
    load_vector,
    mode_extent,
    move_if_full,
    no_select,
    operand_views,
    put_computed_if,
    store_values,
    row_coord,
    store_vector,
    when,
    with_coord_entry,
)
from thunder_fuser.backends.cute.dsl.cute_values import Evaluator, as_vector, cute_where, fast_math_for
from thunder_fuser.backends.cute.lower.expr import Load, Program, Select
from thunder_fuser.backends.cute.tiling.geometry import vector_access
from thunder_fuser.backends.cute.tiling.operands import Geometry
from thunder_fuser.backends.cute.kernel_names import named

POINTWISE_THREADS = 128  # 128-1024 measured within noise of each other (H100, scripts/pointwise_probe.py)


def pointwise_pieces(prog: Program, geo: Geometry):
    """The pointwise template in two pieces, so that several independent programs can share
    a launch: ``setup(ts)`` (host side of the launch: the operand views, the extents a
    thread needs, and the block count) and ``thread(args, lin)`` (one thread's work; ``lin``
    its index within the program's blocks)."""
    if geo.flat:
        return _flat_pointwise_pieces(prog, geo)
    V, T = geo.vector, POINTWISE_THREADS
    rank = len(geo.outer) + 1
    ops = geo.operands
    fast_math = fast_math_for(ops[slot].dtype for slot in geo.store_slot)
    ref_slot = geo.store_slot[0]

    outer_dim = geo.outer_select_dim  # a select along any other dim is along the vector dim
    piece_axis = len(geo.outer) - 1  # an outer select's dim: the outermost of the outer modes

    reuse = geo.reuse
    invariant = {i for i, o in enumerate(ops) if reuse and not o.is_store and o.stride[reuse[0]] == 0}

    def values(t2s, tvs, m, j, N, row_ok, shared, staged=None):
        """The stores' values at row ``m``, vector ``j``; a load of an operand broadcast along
        the reuse mode comes from (and goes to) ``shared``, common to the thread's rows; one
        in ``staged`` (slot -> vector) was read from the block's shared-memory tile."""
        n0 = j * V
        loaded = {}
        if staged:
            loaded.update({(slot, ()): v for slot, v in staged.items()})
        row_at = coord_entry(m, -1) if outer_dim is not None else None  # the position along an outer select

        def at(dim):
            return row_at if dim == outer_dim else n0

        def load(ld: Load):
            slot = geo.load_slot[id(ld)]
            cache = shared if slot in invariant else loaded
            key = (slot, ld.shifts)  # one operand read as two pieces (``cat((x, x))``) is two loads
            if key in cache:
                return cache[key]
            o = ops[slot]
            # a piece of a cat/pad: zero outside its extent along each dim it is shifted along
            row, vec, n, pred, tail = m, j, N, row_ok, geo.tail
            for dim, shift in ld.shifts:
                if dim == outer_dim:
                    ext = o.shape[piece_axis]
                    pred = pred & (row_at >= shift) & (row_at < shift + ext)
                    row = with_coord_entry(m, -1, row_at - shift)
                else:  # pieces start at multiples of V (geometry's vector fit)
                    n = o.shape[-1]
                    pred = pred & (n0 >= shift) & (n0 < shift + n)
                    vec, tail = j - shift // V, False
            val = load_vector(o, t2s[slot], tvs[slot], row, vec, V, n, pred, tail, scalar=True)
            cache[key] = val
            return val

        def select(e: Select, pieces):
            """A cat/pad's vector: each piece computed in a branch of its own, taken where
            the vector lies in that piece (pieces split at vector and row boundaries, so a
            thread takes one). Computing every piece and keeping one made an instruction-
            bound kernel of grouped-query RoPE's backward: 25 loads, their conversions and
            address math a thread, 1100 instructions for 8 elements."""
            out = fragment((1, V), e.dtype)
            out.fill(e.fill)
            pos = at(e.dim)
            for piece, lo, hi in zip(pieces, e.bounds, e.bounds[1:]):
                put_computed_if(out, lambda piece=piece: as_vector(_in_branch(piece), V, e.dtype),
                                (pos >= lo) & (pos < hi))
            return out.load()

        def _in_branch(piece):
            """A piece's value, its loads forgotten after: they exist only in its branch."""
            saved = [(cache, dict(cache)) for cache in (loaded, shared)]
            try:
                return piece()
            finally:
                for cache, before in saved:
                    cache.clear()
                    cache.update(before)

        ev = Evaluator(load, None, select)
        ev.fast_math = fast_math
        return [ev.ev(st.expr) for st in prog.stores]

    def store(vals, t2s, tvs, m, j, N, row_ok):
        for val, slot in zip(vals, geo.store_slot):
            store_vector(val, ops[slot], t2s[slot], tvs[slot], m, j, V, N, row_ok, geo.tail)

    def thread(args, lin):
        t2s, tvs, M, N, nvec = args
        m = lin // nvec
        j = lin - m * nvec
        coord = row_coord(t2s[ref_slot], m, rank, reuse)
        if not reuse:
            store(values(t2s, tvs, coord, j, N, m < M, {}), t2s, tvs, coord, j, N, m < M)
        else:
            # all rows' loads first, then all stores: a store may alias a later row's load as far
            # as the compiler knows, so interleaving them would serialize the rows' memory accesses
            r, rows = reuse
            extent = mode_extent(t2s[ref_slot], rank, r)
            first = coord_entry(coord, r) * rows
            shared, pending = {}, []
            for u in range(rows):  # unrolled: a plain function, traced
                row, ok = with_coord_entry(coord, r, first + u), (m < M) & (first + u < extent)
                pending.append((values(t2s, tvs, row, j, N, ok, shared), row, ok))
            for vals, row, ok in pending:
                store(vals, t2s, tvs, row, j, N, ok)

    def setup(ts):
        t2s, tvs, M, N = operand_views(ts, geo, rank, V, ref_slot)
        if reuse:
            extent = mode_extent(t2s[ref_slot], rank, reuse[0])
            M = M // extent * ((extent + reuse[1] - 1) // reuse[1])  # groups of rows
        nvec = (N + V - 1) // V
        index = cutlass.Int64 if geo.index64 else cutlass.Int32  # the extents' type (``fake_operands``)
        M, N, nvec = index(M), index(N), index(nvec)
        return (t2s, tvs, M, N, nvec), ((M * nvec + T - 1) // T).to(cutlass.Int32)

    return setup, thread, values


def _flat_pointwise_pieces(prog: Program, geo: Geometry):
    """``pointwise_pieces`` over a flat run (``geometry.flat_rows``): thread ``lin`` computes
    vector ``lin`` of the rows back to back, which may span two rows. The operands laid out
    so (``vector_access``) move whole vectors, but for the run's last vector, which may end
    inside it (element by element: N >= V puts all of it in the last row); every other
    operand (a bias along the rows, a value per row) element by element at each element's
    row and column."""
    V, T = geo.vector, POINTWISE_THREADS
    ops = geo.operands
    fast_math = fast_math_for(ops[slot].dtype for slot in geo.store_slot)
    whole = [vector_access(geo, o) for o in ops]

    def setup(ts):
        t2s, tvs, M, N = operand_views(ts, geo, 2, V, geo.store_slot[0])
        count = ((cutlass.Int64(M) * N.to(cutlass.Int64) + V - 1) // V).to(cutlass.Int32)
        tvs = tuple(flat_view(t2s[s], 0, count, V) if whole[s] else tvs[s] for s in range(len(ops)))
        return (t2s, tvs, M, N, count), (count + T - 1) // T

    def thread(args, lin):
        t2s, tvs, M, N, count = args
        first = cutlass.Int64(lin) * V  # the vector's first element in the run
        m = (first // N.to(cutlass.Int64)).to(cutlass.Int32)
        n0 = (first - cutlass.Int64(m) * N.to(cutlass.Int64)).to(cutlass.Int32)
        ok = lin < count
        # the limit a whole vector's moves see: past the vector, but N for the run's last
        limit = cute_where(lin == count - 1, N, n0 + V)

        def vector(in_row: bool):
            """The stores of this vector: ``in_row``, for a vector inside row ``m`` (all but
            one in ``N // V``), reads an operand that is one value per row once, as a
            scalar (``load_vector``'s), and computes an iota from the vector's first
            column; otherwise each element at its own row and column (the vector may
            reach into row ``m + 1``)."""
            loaded = {}

            def load(ld: Load):
                slot = geo.load_slot[id(ld)]
                if slot in loaded:
                    return loaded[slot]
                o = ops[slot]
                frag = fragment((1, V), o.dtype)
                frag.fill(0)
                if whole[slot]:
                    move_if_full(frag, tvs[slot][(None, (0, lin))], t2s[slot], m, n0, limit, ok, V, False)
                elif in_row and o.stride[-1] == 0:  # one value for the vector
                    loaded[slot] = (iota_at(o, t2s[slot], m, 0) if o.iota is not None
                                    else frag.element_type(t2s[slot][(m, 0)]))
                    return loaded[slot]
                elif in_row and o.iota is not None and o.stride[-1] == 1:  # from the first column
                    at = cutlass.Int64(cute.crd2idx((m, n0), t2s[slot].layout))
                    for k in range(V):
                        frag[k] = iota_value(o, at, k)
                elif in_row:
                    for k in range(V):
                        frag[k] = (iota_at(o, t2s[slot], m, n0 + k) if o.iota is not None
                                   else frag.element_type(t2s[slot][(m, n0 + k)]))
                elif o.iota is not None:  # computed at each element's row and column
                    for k in range(V):
                        wraps = n0 + k >= N
                        frag[k] = iota_at(o, t2s[slot], cute_where(wraps, m + 1, m),
                                          cute_where(wraps, n0 + k - N, n0 + k))
                else:
                    _gather_across_rows(frag, t2s[slot], m, n0, M, N, V)
                loaded[slot] = frag.load()
                return loaded[slot]

            ev = Evaluator(load, None, no_select)
            ev.fast_math = fast_math
            for st, slot in zip(prog.stores, geo.store_slot):
                frag = fragment((1, V), ops[slot].dtype)
                store_values(frag, as_vector(ev.ev(st.expr), V, ops[slot].dtype))
                move_if_full(frag, tvs[slot][(None, (0, lin))], t2s[slot], m, n0, limit, ok, V, True)

        # two predicated blocks, not if/else (see ``move_if_full``)
        in_row = ok & (n0 + V <= N)
        when(in_row, lambda: vector(True))
        when(ok & (n0 + V > N), lambda: vector(False))

    return setup, thread, None


@cute.jit
def _gather_across_rows(frag: cute.Tensor, t2: cute.Tensor, m, n0, M, N, width: cutlass.Constexpr):
    """Elements ``n0 ..`` of row ``m``, those past its end from the start of row ``m + 1``
    (a flat run's vector spans two rows at most: ``width <= N``). Branch-free: a row past
    the last reads the last row's element instead (elements past the run's end, or a thread
    past its last vector, are never stored), which ran 6% faster than predicated loads
    (H100: gelu(x + b) of bf16 [8192, 4097] 0.064 -> 0.060 ms)."""
    last = M - 1
    for k in cutlass.range_constexpr(width):
        wraps = n0 + k >= N
        row = cutlass.min(cute_where(wraps, m + 1, m), last)
        frag[k] = frag.element_type(t2[(row, cute_where(wraps, n0 + k - N, n0 + k))])


def build_pointwise(prog: Program, geo: Geometry):
    setup, thread, _ = pointwise_pieces(prog, geo)
    T = POINTWISE_THREADS

    @cute.kernel
    def kernel(t2s, tvs, M, N, nvec):  # Int32, or Int64 where the geometry needs 64-bit indices
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        thread((t2s, tvs, M, N, nvec), first_thread(bidx, T, geo.index64) + tidx)

    named(kernel, "pointwise", [prog])

    @cute.jit
    def launch(ts, stream):
        (t2s, tvs, M, N, nvec), blocks = setup(ts)
        kernel(t2s, tvs, M, N, nvec).launch(grid=[blocks, 1, 1], block=[T, 1, 1], stream=stream)

    return launch


def first_thread(bidx, T: int, index64: bool):
    """The linear index of block ``bidx``'s first thread, in 64 bits where the threads
    number 2**31 or more."""
    return cutlass.Int64(bidx) * T if index64 else bidx * T


def build_pointwise_group(progs: list, geos: list):
    """Independent pointwise programs in one launch: the grid is their blocks one after the
    other, and a block runs the program its index falls in (schedule.launch_steps)."""
    pieces = [pointwise_pieces(p, g) for p, g in zip(progs, geos)]
    T = POINTWISE_THREADS

    @cute.kernel
    def kernel(args, starts):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        for i in cutlass.range_constexpr(len(pieces)):
            if (bidx >= starts[i]) & (bidx < starts[i + 1]):
                pieces[i][1](args[i], (bidx - starts[i]) * T + tidx)  # no member stages (launch_group)

    named(kernel, "pointwise_group", progs)

    @cute.jit
    def launch(ts_list, stream):
        args, starts = [], [cutlass.Int32(0)]
        for i in cutlass.range_constexpr(len(pieces)):
            a, blocks = pieces[i][0](ts_list[i])
            args.append(a)
            starts.append(starts[-1] + blocks)
        kernel(tuple(args), tuple(starts)).launch(grid=[starts[-1], 1, 1], block=[T, 1, 1], stream=stream)

    return launch
