"""How a kernel reaches its operands: views, predicated copies, vector loads and stores.

Operands arrive as ``[outer dims innermost-first..., N]`` (``geometry.py``), most of them
as their base tensor, from which the launch function builds the view (``_from_bases``,
``base_maps.BaseMap``). A kernel views each as 2-D ``(M, N)`` with a hierarchical first mode,
so one linear row index ``m`` addresses any number of outer dims, each with its own stride.
Along ``N`` an operand of stride 1 moves in vectors of ``V`` elements (at most 16 bytes), a
stride-0 one is one scalar load, any other stride ``V`` scalar loads.

Only the helpers that branch or loop on run-time values are ``@cute.jit`` (the DSL rewrites
their ``if`` and ``for``; ``for_range`` runs a plain-Python body in such a loop), and they
live in real source files, as CuTe DSL requires. Shared by every kernel family.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from thunder_fuser.backends.cute.dsl.cute_values import Evaluator, as_vector, cast, cute_dtype
from thunder_fuser.backends.cute.lower.expr import Load, Program, subexpressions
from thunder_fuser.backends.cute.tiling.base_maps import Run, mapped_layout, ref_first
from thunder_fuser.backends.cute.tiling.geometry import operand_align, vector_access, vector_width
from thunder_fuser.backends.cute.tiling.operands import Geometry
from thunder_fuser.backends.cute.unsupported import Unsupported

STREAM_UNROLL = 4  # vectors a thread loads per step of a loop along a row (a split row, a row too long
#                   for registers) or down columns, all before it uses any: a step per vector kept one
#                   load in flight
LOOP_UNROLL = 2  # likewise in a looped row's passes (measured: rows_geometry, "A looped row steps")
# L2 eviction priorities of a load's ``.L2::cache_hint`` (the 64-bit policies CUTLASS's
# ``CacheHintSm90`` names): "keep" loads a line the L2 evicts last
_CACHE_POLICY = {"keep": 0x14F0000000000000}


@cute.jit
def _copy_if(src: cute.Tensor, dst: cute.Tensor, pred: cutlass.Boolean, hint: cutlass.Constexpr = None):
    """One vector between registers and global memory where ``pred``. ``hint`` (CACHE_HINTS):
    "store" streams it (st.global.cs), "load" marks it the line's last use (ld.global.lu);
    the L2 evicts such lines first; "keep" loads it to be evicted last (a row a later pass
    reads again). Whole 16-byte accesses of floats only (``_hinted``)."""
    if pred:
        if cutlass.const_expr(hint is None):
            cute.autovec_copy(src, dst)
        else:
            n = 128 // src.element_type.width  # elements per 16-byte access
            atom = _hinted_copy_atom(hint, src.element_type)
            whole = cute.logical_divide(cute.coalesce(src), n), cute.logical_divide(cute.coalesce(dst), n)
            if cutlass.const_expr(hint in _CACHE_POLICY):
                cute.copy(atom, *whole, cache_policy=cutlass.Int64(_CACHE_POLICY[hint]))
            else:
                cute.copy(atom, *whole)


def _hinted_copy_atom(hint: str, dtype):
    """A 16-byte copy of ``dtype`` to global memory that streams ("store"), or from it,
    marked the line's last use ("load") or plain (a cache policy goes with it: "keep")."""
    if hint == "store":
        return cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), dtype, num_bits_per_copy=128,
                                   store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING)
    if hint in _CACHE_POLICY:
        return cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), dtype, num_bits_per_copy=128)
    return cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), dtype, num_bits_per_copy=128,
                               load_cache_mode=cute.nvgpu.LoadCacheMode.LAST_USE)


@cute.jit
def _gather_if(frag: cute.Tensor, t2: cute.Tensor, m, n0, limit, pred: cutlass.Boolean, width: cutlass.Constexpr,
               edge: cutlass.Constexpr = False):
    """Elements ``n0 ..`` of row ``m`` below ``limit``; an ``edge`` vector of a flat row
    (``geometry.flat_rows``) starts before the row, whose elements there are not read."""
    for k in cutlass.range_constexpr(width):
        if pred and n0 + k < limit and (not edge or n0 + k >= 0):
            frag[k] = frag.element_type(t2[(m, n0 + k)])  # a bool element reads as Int8 (see move_if_full)


@cute.jit
def lanes_inside(n0, limit, pred: cutlass.Boolean, width: cutlass.Constexpr):
    """Which of elements ``n0 .. n0 + width`` lie in ``[0, limit)`` (where ``pred``), as a
    vector of booleans."""
    lanes = cute.make_rmem_tensor((1, width), cutlass.Boolean)
    for k in cutlass.range_constexpr(width):
        lanes[k] = pred & (n0 + k >= 0) & (n0 + k < limit)
    return lanes.load()


@cute.jit
def scatter_if(frag: cute.Tensor, t2: cute.Tensor, m, n0, limit, pred: cutlass.Boolean, width: cutlass.Constexpr,
                edge: cutlass.Constexpr = False):
    for k in cutlass.range_constexpr(width):
        if pred and n0 + k < limit and (not edge or n0 + k >= 0):
            t2[(m, n0 + k)] = frag[k]


@cute.jit
def move_if_full(frag: cute.Tensor, tile: cute.Tensor, t2: cute.Tensor, m, n0, limit, pred: cutlass.Boolean,
                  width: cutlass.Constexpr, store: cutlass.Constexpr):
    """One vector access where the whole vector is inside ``limit``, else element by
    element (the ragged tail); ``store`` picks the direction. Two predicated blocks, not
    if/else: CuTe DSL 4.8 compiled this element loop under an ``else`` to nothing (no scalar
    access in the PTX; tests/test_kernels.py's "pointwise ragged 1-D" family checks them)."""
    full = pred & (n0 + width <= limit)
    if full:
        if cutlass.const_expr(store):
            cute.autovec_copy(frag, tile)
        else:
            cute.autovec_copy(tile, frag)
    for k in cutlass.range_constexpr(width):
        if (not full) & pred & (n0 + k < limit):
            if cutlass.const_expr(store):
                t2[(m, n0 + k)] = frag[k]
            else:
                # a bool element reads as Int8 here (CuTe DSL 4.8): converted, or the store
                # into the Boolean fragment fails to compile (a ragged bool mask's tail)
                frag[k] = frag.element_type(t2[(m, n0 + k)])


@cute.jit
def when(pred: cutlass.Boolean, fn: cutlass.Constexpr):
    """``fn()`` (plain Python emitting IR, its effects stores) where ``pred``, a run-time
    branch."""
    if pred:
        fn()


def store_values(frag: cute.Tensor, vec) -> None:
    """``frag.store(vec)``, a bool as torch stores one: the byte 1 for true. CuTe DSL stores
    its Boolean as the sign extension of an i1, the byte 0xFF, which torch reads as an
    invalid bool (``.sum()`` counts 255 for it) and a kernel's byte read of it (a row's
    scalar) as -1: a loss whose mask one region wrote and another read came out negated."""
    if frag.element_type is cutlass.Boolean:
        one, zero = (cute.full(vec.shape, v, cutlass.Int8) for v in (1, 0))
        cute.recast_tensor(frag, cutlass.Int8).store(cute.where(vec, one, zero))
    else:
        frag.store(vec)


def storable(value, element_type):
    """A scalar ``value`` for an element of ``element_type``: a bool as the byte 1 or 0
    (``store_values``)."""
    if element_type is cutlass.Boolean and isinstance(value, cutlass.Numeric):
        return cutlass.select_(cutlass.Boolean(value), cutlass.Int8(1), cutlass.Int8(0))
    return value


@cute.jit
def put_computed_if(frag: cute.Tensor, compute, pred: cutlass.Boolean):
    """``frag`` set to ``compute()``, computed only where ``pred`` holds: a branch, so that
    a thread computes (and loads) only the piece of a cat/pad it stores."""
    if pred:
        store_values(frag, compute())


@cute.jit
def store_scalar_if(t2: cute.Tensor, m, n, value, pred: cutlass.Boolean):
    if pred:
        t2[(m, n)] = storable(value, t2.element_type)


@cute.jit
def load_scalar_if(t2: cute.Tensor, m, n, pred: cutlass.Boolean):
    v = t2.element_type(0)
    if pred:
        v = t2.element_type(t2[(m, n)])  # a bool element reads as Int8: back to a bool
    return v


def shape_of(t: cute.Tensor):
    """``t``'s shape with each dynamic extent at its own width: ``Tensor.shape`` reads a
    64-bit extent as 32 bits (CuTe DSL 4.8: "CuTe IR only supports Int32" when it unpacks
    a shape), ``cute.size`` of the mode does not (``geometry.needs_64bit_indices``)."""

    def walk(s, path):
        if isinstance(s, tuple):
            return tuple(walk(x, path + [i]) for i, x in enumerate(s))
        return s if isinstance(s, int) else cute.size(t, mode=path)

    return walk(t.shape, [])


def _as_2d(t: cute.Tensor, rank: int) -> cute.Tensor:
    if rank == 1:
        return cute.make_tensor(t.iterator, cute.make_layout((1, cute.size(t, mode=[0])), stride=(0, t.stride[0])))
    if rank == 2:
        return t
    return cute.group_modes(t, 0, rank - 1)


def flat_view(t2: cute.Tensor, start, count, V: int) -> cute.Tensor:
    """A flat row's vector view (``geometry.flat_rows``): the ``count`` vectors of the flat
    run of rows from element ``start`` (a multiple of ``V``) on, ``((1, V), (rows, count))``,
    its row mode of stride 0 so that the row's coordinate indexes it as any vector view."""
    layout = cute.make_layout(((1, V), (t2.shape[0], count)), stride=((0, 1), (0, V)))
    return cute.make_tensor(t2.iterator + start, layout)


def _vector_view(t2: cute.Tensor, V: int) -> cute.Tensor:
    """``t2`` tiled into ``(1, V)`` vectors along its second mode: ``((1, V), (M, nvec))``.
    Built from the strides rather than by ``zipped_divide``, which divides the hierarchical
    row mode by 1 and so costs a division per mode and per access at run time."""
    rows, n = shape_of(t2)
    row_stride, n_stride = t2.stride
    layout = cute.make_layout(((1, V), (rows, (n + V - 1) // V)), stride=((0, n_stride), (row_stride, V * n_stride)))
    return cute.make_tensor(t2.iterator, layout)


def _from_bases(ts, geo: Geometry):
    """The operands passed as their base tensors (``Geometry.base_maps``), built here, in
    the launch function, rather than by an ``as_strided`` per call: each mode a base dim, a
    run of them or a slice of one, a broadcast with the extent of operand ``geo.map_ref``,
    or extent 1; an operand with an offset comes as (base, element offset), its pointer
    taken as aligned to its vector, which the compiler cannot know of an offset
    (``align_checks`` check it per call; the address is not rounded, so a call that skipped
    them fails loudly on a misaligned access rather than reading beside the view)."""
    maps, ref = geo.base_maps, geo.map_ref
    if not any(maps):
        return ts
    out = list(ts)
    for i in ref_first(len(ts), ref):
        m = maps[i]
        if m:
            b, ptr = (out[i][0], out[i][0].iterator + out[i][1]) if m.offset else (out[i], out[i].iterator)
            align = operand_align(geo, geo.operands[i])
            if align > ptr.alignment:
                ptr = cute.make_ptr(ptr.dtype, ptr.toint(), ptr.memspace, assumed_align=align)
            shape, stride = mapped_layout(m, shape_of(b), b.stride, None if i == ref else shape_of(out[ref]))  # built first
            out[i] = cute.make_tensor(ptr, cute.make_layout(shape, stride=stride))
    return tuple(out)


def operand_views(ts, geo: Geometry, rank: int, V: int, ref_slot: int):
    """Every operand as 2-D ``(M, N)`` and tiled by vectors, and the extents of the domain
    (read from a stored operand: pieces of a cat have their own ``N``)."""
    ts = _from_bases(ts, geo)
    t2s = tuple(_as_2d(t, rank) for t in ts)
    tvs = tuple(_vector_view(t, V) for t in t2s)
    ref = t2s[ref_slot]
    return t2s, tvs, cute.size(ref, mode=[0]), cute.size(ref, mode=[1])


def row_coord(t2: cute.Tensor, m, rank: int, group: tuple = ()):
    """Row ``m`` as a coordinate of the hierarchical first mode, innermost first, divided
    out once per thread from ``t2``'s extents: every operand then indexes with it by
    multiply-adds alone (CuTe would divide a linear index once per operand and access).
    ``group`` = (mode, rows): ``m`` counts groups of ``rows`` along that mode, and the
    coordinate's entry there is the group's index."""
    if rank <= 2:
        return m
    extents = list(shape_of(t2)[0][:-1])
    if group and group[0] < len(extents):
        r, rows = group
        extents[r] = (extents[r] + rows - 1) // rows
    coord = []
    for s in extents:
        q = m // s
        coord.append(m - q * s)
        m = q
    return tuple(coord) + (m,)


def mode_extent(t2: cute.Tensor, rank: int, r: int):
    return cute.size(t2, mode=[0]) if rank <= 2 else cute.size(t2, mode=[0, r])


def with_coord_entry(coord, r: int, value):
    """``coord`` with entry ``r`` replaced (-1: the outermost, an outer select's piece row)."""
    if not isinstance(coord, tuple):
        return value
    r %= len(coord)
    return tuple(value if i == r else c for i, c in enumerate(coord))


def coord_entry(coord, r: int):
    return coord[r] if isinstance(coord, tuple) else coord


def fake_operands(geo: Geometry):
    """Fake tensors with symbolic extents and strides: only what the signature fixes is
    static (strides 0 and 1, piece extents)."""
    extent = cute.sym_int64 if geo.index64 else cute.sym_int32
    outer = [extent() for _ in geo.outer]
    n_div = 1 if geo.tail or geo.flat else geo.vector  # flat rows: N is any length (``geometry.flat_rows``)
    n = extent(divisibility=n_div)
    fakes = []
    for o in geo.operands:
        shape = list(reversed(outer)) + [n if o.shape[-1] == geo.n else o.shape[-1]]
        if geo.outer_select:  # the select dim (outermost) is static: pieces have their own extent
            shape[len(outer) - 1] = o.shape[len(outer) - 1]
        if not geo.outer:
            shape = [shape[-1]]
        vec = o.inner_mode == "vec"
        strides = []
        staged_mode = geo.stage[0] if geo.stage and len(fakes) in geo.stage[1] else None
        for r, s in enumerate(o.stride[:-1] if geo.outer else ()):
            strides.append(0 if s == 0 else 1 if r == staged_mode else cute.sym_int64(divisibility=n_div if vec else 1))
        strides.append(1 if vec else (0 if o.inner_mode == "bcast" else cute.sym_int64()))
        align = operand_align(geo, o)
        m = geo.base_maps[len(fakes)] if geo.base_maps else None
        if not m:
            fakes.append(make_fake_tensor(cute_dtype(o.dtype), tuple(shape), tuple(strides), assumed_align=align))
            continue
        # the base tensor as it is: a dim that is a mode carries the mode's symbols, the
        # innermost dim of a run its stride; every other extent and stride is free
        ndim = geo.bases[o.source].ndim
        bshape, bstride = [extent() for _ in range(ndim)], [cute.sym_int64() for _ in range(ndim)]
        for j, e in enumerate(m.modes):
            if isinstance(e, Run):
                bstride[e.dims[-1]] = strides[j]
            elif e >= 0:
                bshape[e], bstride[e] = shape[j], strides[j]
        # an offset start's alignment is checked per call and restored by the launch function
        base = make_fake_tensor(cute_dtype(o.dtype), tuple(bshape), tuple(bstride),
                                assumed_align=o.dtype.itemsize if m.offset else align)
        fakes.append((base, cute.sym_int64()) if m.offset else base)
    return tuple(fakes)


def access_mode(o, V) -> str:
    """How a thread reads its ``V`` elements of operand ``o``: one vector access (stride 1),
    one element for all (stride 0), or ``V`` element accesses."""
    mode = o.inner_mode
    return "gather" if mode == "vec" and V == 1 else mode


def fragment(shape, dt):
    return cute.make_rmem_tensor(shape, cute_dtype(dt))


def iota_at(o, t2, m, n, k: int = 0):
    """Element ``(m, n)`` of an iota operand, ``k`` positions further along a stride-1
    ``N``, computed from its index in the view: the value ``start + step * index`` of the
    vector it views. A causal mask compares two of these per element, which a kernel
    otherwise loads as 8-byte integers, with the registers to hold them."""
    return iota_value(o, cutlass.Int64(cute.crd2idx((m, n), t2.layout)), k)


def iota_value(o, idx, k: int = 0):
    start, step, off = o.iota
    if step != 1:  # 64-bit multiplies are several instructions: the usual arange has none
        idx = idx * step
    return cute_dtype(o.dtype)(idx + (start + step * (off + k)))


def load_vector(o, t2, tv, m, j, V, N, pred, tail=False, hint=None, shift=None, scalar=False):
    """Vector ``j`` of row ``m`` of operand ``o``: one access (stride 1), one element for all
    (stride 0) or ``V`` accesses; zeros where ``pred`` is false. ``tail``: ``N`` may end
    inside the vector (1-D pointwise only). An iota operand is computed, not loaded.
    ``shift``: ``j`` counts the vectors of a flat row (``geometry.flat_rows``), whose first
    ``shift`` elements are the row before's: read element by element, the row's only (an
    edge vector, or an operand that does not move whole vectors: ``shifted_operand``).
    ``scalar``: an operand that is one value for the whole vector (stride 0) comes as a
    scalar, so that the math over such values alone runs once per vector, not per lane (a
    loss's backward divides a row's scale by the rows that count: a ``div.rn.f32`` per
    element took it from the memory bound)."""
    mode = access_mode(o, V)
    if mode == "bcast":
        one = fragment((1, 1), o.dtype)
        if o.iota is not None:
            one[0] = iota_at(o, t2, m, 0)
        else:
            one.fill(0)
            _gather_if(one, t2, m, 0, 1, pred, 1)
        if scalar:
            return one[0]
        return one.load().broadcast_to((1, V)) if V > 1 else one.load()
    frag = fragment((1, V), o.dtype)
    if o.iota is not None and mode == "vec" and shift is None:
        first = cutlass.Int64(cute.crd2idx((m, j * V), t2.layout))  # one index per vector
        for k in range(V):
            frag[k] = iota_value(o, first, k)
        return frag.load()
    if o.iota is not None:  # a flat row's vector starts ``shift`` elements before the row's column j * V
        n0 = j * V if shift is None else j * V - shift
        for k in range(V):
            frag[k] = iota_at(o, t2, m, n0 + k)
        return frag.load()
    frag.fill(0)
    if mode == "vec" and shift is not None:
        _gather_if(frag, t2, m, j * V - shift, N, pred, V, True)
    elif mode == "vec" and not tail:
        _copy_if(tv[(None, (m, j))], frag, pred, None if o.same_every_row else _hinted(hint, frag))
    elif mode == "vec":
        move_if_full(frag, tv[(None, (m, j))], t2, m, j * V, N, pred, V, False)
    else:
        _gather_if(frag, t2, m, j * V, N, pred, V)
    return frag.load()


def store_vector(val, o, t2, tv, m, j, V, N, pred, tail=False, hint=None, shift=None):
    frag = fragment((1, V), o.dtype)
    store_values(frag, as_vector(val, V, o.dtype))
    mode = access_mode(o, V)
    if mode == "vec" and shift is not None:
        scatter_if(frag, t2, m, j * V - shift, N, pred, V, True)
    elif mode == "vec" and not tail:
        _copy_if(frag, tv[(None, (m, j))], pred, _hinted(hint, frag))
    elif mode == "vec":
        move_if_full(frag, tv[(None, (m, j))], t2, m, j * V, N, pred, V, True)
    else:
        scatter_if(frag, t2, m, j * V, N, pred, V)


def _hinted(hint, frag):
    """``hint`` where a vector is whole 16-byte accesses of floats, which the hinted copy moves."""
    t = frag.element_type
    return hint if t in (cutlass.Float32, cutlass.Float16, cutlass.BFloat16) and (cute.size(frag) * t.width) % 128 == 0 else None


def no_select(e, pieces):
    raise Unsupported("cat/pad in a reduction kernel")


def element_evaluator(geo: Geometry, t2s, m, n, pred, row_value) -> "Evaluator":
    """An evaluator for the one element ``(m, n)`` of any operand, read as scalars where
    ``pred`` (a cross-entropy's logit at the row's target column)."""

    def load(ld: Load):
        slot = geo.load_slot[id(ld)]
        if geo.operands[slot].iota is not None:
            return iota_at(geo.operands[slot], t2s[slot], m, n)
        return load_scalar_if(t2s[slot], m, n, pred)

    return Evaluator(load, row_value, no_select)


def row_evaluator(geo: Geometry, t2s, m, n, pred, row_value) -> "Evaluator":
    """An evaluator for one value per row (``n == 0``) or per column (``m == 0``): its
    loads are row-shaped inputs, read as scalars."""

    def load(ld: Load):
        if not ld.row:
            raise Unsupported(f"{ld.source.name} read in a per-row value")
        slot = geo.load_slot[id(ld)]
        if geo.operands[slot].iota is not None:
            return iota_at(geo.operands[slot], t2s[slot], m, n)
        return load_scalar_if(t2s[slot], m, n, pred)

    return Evaluator(load, row_value, no_select)


def vector_evaluator(geo: Geometry, t2s, tvs, m, j, N, pred, row_value, hint=None, shift=None,
                      edge=False) -> "Evaluator":
    """An evaluator for vector ``j`` of row ``m`` that reads each operand once. ``shift``,
    ``edge``: see ``shifted_operand``."""
    loaded = {}

    def load(ld: Load):
        slot = geo.load_slot[id(ld)]
        if slot not in loaded:
            o = geo.operands[slot]
            loaded[slot] = load_vector(o, t2s[slot], tvs[slot], m, j, geo.vector, N, pred, hint=hint,
                                        shift=shifted_operand(geo, o, shift, edge))
        return loaded[slot]

    return Evaluator(load, row_value, no_select)


def shifted_operand(geo: Geometry, o, shift, edge: bool):
    """The shift by which a flat row (``_flat_row_views``: its first element lies ``shift``
    elements into its first vector) reads operand ``o`` element by element, or None where it
    moves whole vectors of it: every operand of an ``edge`` vector, shared with a
    neighbouring row, and, in every vector, an operand without vector access (a weight)."""
    return shift if shift is not None and (edge or not vector_access(geo, o)) else None


@cute.jit
def for_range(start, stop, step: cutlass.Constexpr, fn: cutlass.Constexpr):
    """A run-time loop whose body ``fn(i)`` is plain Python emitting IR (the DSL rewrites
    loops only in jit functions). Values leave the body through register tensors."""
    for i in cutlass.range(start, stop, step):
        fn(i)


def unroll(geo: Geometry) -> int:
    """Vectors a thread loads per step of a loop: STREAM_UNROLL 16-byte vectors of the
    narrowest operand (LOOP_UNROLL in a looped row), so more where the vector is narrowed to
    the widest store's 16 bytes (``geometry.vector_width``): a step keeps as many bytes in
    flight. H100, scripts/long_rows_probe.py: log_softmax fp32 of bf16 [4096, 32000]
    (looped) took 0.315 ms in 4 vectors of 8 per step, 0.333 in 4 of 4 and 0.289 in 8 of 4."""
    steps = LOOP_UNROLL if geo.looped else STREAM_UNROLL
    return steps * vector_width(geo.operands, False) // vector_width(geo.operands)


def loaded_batch(geo: Geometry, t2s, tvs, m, j, step: tuple, ok, end, N, loads, row_value, hint=None,
                  shift=None) -> list:
    """One step of a thread's loop: (evaluator, row, vector index, predicate) of
    ``unroll`` vectors, the u-th at ``(m + u * step[0], j + u * step[1])`` (along a row, or down a
    column), with ``loads`` issued for all before any math uses one. A vector whose moving
    coordinate is at or past ``end`` loads nothing; ``end`` None: every vector is inside
    (no predicate at all). ``shift``: a flat row's (``shifted_operand``)."""
    batch = []
    for u in range(unroll(geo)):
        # a coordinate that does not move stays as it is: a row's may be a tuple (outer modes that do not merge)
        mm = m + u * step[0] if step[0] else m
        jj = j + u * step[1] if step[1] else j
        pred = True if end is None else ok & ((mm if step[0] else jj) < end)
        ev = vector_evaluator(geo, t2s, tvs, mm, jj, N, pred, row_value, hint, shift)
        for ld in loads:
            ev.ev(ld)
        batch.append((ev, mm, jj, pred))
    return batch


def streamed_loads(roots) -> list:
    """The loads a loop step reads for ``roots`` (a reduction's operand loads are its own
    pass's, not these expressions')."""
    return [e for e in subexpressions(roots, into_reductions=False) if isinstance(e, Load)]


def store_row_values(prog: Program, geo: Geometry, t2s, m, pred, row_value) -> None:
    """The program's per-row stores at row ``m`` (one thread's, where ``pred``)."""
    ev = row_evaluator(geo, t2s, m, 0, pred, row_value)
    for st, slot in zip(prog.stores, geo.store_slot):
        if st.is_row:
            val = ev.ev(st.expr)
            if isinstance(val, cute.TensorSSA):
                raise Unsupported("a row result that is a vector")
            store_scalar_if(t2s[slot], m, 0, cast(val, geo.operands[slot].dtype), pred)
