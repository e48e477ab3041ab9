"""Where a program's operands live: strides over the domain, dim order, coalescing, vector width.

Computed once per plan from the first call's real tensors (a plan is keyed by the input
strides, and every intermediate's strides follow from them). The result has two halves:

* the *signature*: what the compiled kernel depends on (rank after coalescing, which
  strides are 0 or 1, vector width, row tiling). It goes into the compile key; extents and
  other strides stay symbolic, so one kernel serves every size with that signature.
* the *views*: per operand, the (shape, stride, offset) that presents its tensor to the
  kernel as ``[outer dims innermost-first..., N]``. The kernel's launch function builds
  most views from their base tensors (``base_maps.py``); any other is one ``as_strided``
  per call.

Dims are ordered by the first stored output's allocation order (so its innermost dim is the
vector dim). A reduction whose reduced dims are innermost in memory is a *row* reduction
(the reduced dims go innermost); one whose kept dims are innermost is a *column* reduction
(the kept dims go innermost, as the vector dim, and the reduced dims outer). Adjacent dims
merge when every operand steps through them as through one dim (the TensorIterator rule).

This module holds what every family shares (dim order, merging, vector width, flat runs of
rows of odd length); each family's own tiling is in its ``*_geometry.py`` (``rows_geometry``,
``columns_geometry``, ``pointwise_geometry``), none of which imports the DSL.
"""

from __future__ import annotations

import math

import torch

from thunder_fuser.ir.torch_impls import REFERENCE_IMPLS
from thunder_fuser.ir.long_reductions import INT32_LIMIT
from thunder_fuser.backends.cute.tiling.base_maps import choose_map_ref, mode_map, ref_first, static_modes
from thunder_fuser.backends.cute.tiling.columns_geometry import column_splits
from thunder_fuser.backends.cute.lower.expr import Program, column_sums, has_reduce, reads_rows_once, reductions_in_order, trailing_merge
from thunder_fuser.backends.cute.tiling.operands import Geometry, Operand
from thunder_fuser.backends.cute.tiling.pointwise_geometry import broadcast_reuse, transpose_stage
from thunder_fuser.backends.cute.tiling.rows_geometry import (
    COLUMN_SUM_REGISTERS,
    FLAT_MIN_VECTORS,
    across_splits,
    row_tiling,
    rows_to_split,
    split_row_tiling,
)
from thunder_fuser.backends.cute.unsupported import Unsupported

MAX_VECTOR = 8  # elements per thread per access: 16 bytes of bf16
# A vector is 16 bytes of the narrowest operand, but never more than 16 bytes of the widest
# store (``vector_width``): a warp's store of 32-byte vectors (fp32 results of bf16) moved
# in two 16-byte halves, each writing half of every sector it touched. H100,
# scripts/long_rows_probe.py, ms, vectors of 8 / 4: x.float() * 2 of bf16 [8192, 8192]
# 0.147 / 0.139; softmax fp32 of bf16 [8192, 4096] 0.083 / 0.072; log_softmax fp32 of bf16
# [16384, 4096] 0.151 / 0.139, [65536, 1024] 0.145 / 0.139, [1024, 128256] (looped) 0.427 /
# 0.363; torch.compile 0.139, 0.090, 0.16-0.19, 0.47, 0.39-0.54.
# Wider loads cost nothing (a load's second half hits L1): capped at 16 bytes of the widest
# load too, fp32 inputs of bf16 results (a cast, an RMSNorm, a softmax, a residual add) ran
# within 1%, at the copy bandwidth either way.
VECTOR_BY_STORES = True  # False only to measure vectors of 16 bytes of the narrowest operand
FLAT_ROWS = True  # ``flat_rows``; False only to measure a row of odd length in vectors of one element
GATHER_ROWS = True  # a row reduction may read an operand strided along its row, element by element


def _view(base: torch.Tensor, views) -> torch.Tensor:
    t = base
    for node in views:
        args = (t,) + tuple(node.args[1:])
        t = REFERENCE_IMPLS[node.op](*args, **node.kwargs)
        if t.numel() and t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
            raise Unsupported(f"{node.op} of {views[0].args[0].name} needs a copy at these strides")
    return t


def _domain_view(t: torch.Tensor, domain, reduced, is_row: bool, name: str) -> torch.Tensor:
    if tuple(t.shape) == tuple(domain):
        return t
    if is_row:
        keep = tuple(1 if d in reduced else s for d, s in enumerate(domain))
        try:
            return t.view(keep).expand(domain)
        except RuntimeError:
            pass
    elif t.numel() == math.prod(domain):
        try:
            return t.view(domain)
        except RuntimeError:
            pass
    raise Unsupported(f"{name} {tuple(t.shape)} cannot be viewed over the domain {tuple(domain)}")


def _by_stride(ref: torch.Tensor) -> list[int]:
    return sorted(range(ref.ndim), key=lambda d: (-ref.stride(d) if ref.shape[d] != 1 else 0, d))


def _innermost(ref: torch.Tensor) -> int | None:
    """The reference operand's fastest dim of more than one element (a broadcast dim has
    no place in memory)."""
    inner = [d for d in _by_stride(ref) if ref.shape[d] > 1 and ref.stride(d) != 0]
    return inner[-1] if inner else None


def _kept_innermost(ref: torch.Tensor, reduced) -> bool:
    """Is the reference operand's fastest dim a kept one?"""
    d = _innermost(ref)
    return d is not None and d not in reduced


def _order(ref: torch.Tensor, reduced, inner_select, outer_select, columns: bool) -> list[int]:
    """Domain dims outermost first: by the reference operand's strides; reduced dims (rows),
    kept dims (columns) or the select dim (cat/pad) that is fastest in memory innermost; a
    select dim that is not goes outermost (the kernel picks pieces by rows)."""
    by_stride = _by_stride(ref)
    if columns:
        inner = [d for d in by_stride if d not in reduced]
    elif reduced:
        inner = [d for d in by_stride if d in reduced]
    else:
        inner = [inner_select] if inner_select is not None else []
    head = [outer_select] if outer_select is not None else []
    return head + [d for d in by_stride if d not in inner and d not in head] + inner


def _select_axes(prog: Program, ref: torch.Tensor, domain) -> tuple[int | None, int | None]:
    """(inner, outer) select dims: a cat/pad dim that is the reference operand's fastest
    runs along the vector dim, another one along the outermost outer mode."""
    sels = prog.select_dims
    fastest = _innermost(ref)
    inner = fastest if fastest in sels else None
    outer = [d for d in sels if d != inner]
    if len(outer) > 1:
        raise Unsupported(f"cat/pad along dims {list(sels)}, neither of them the fastest in memory")
    if outer and domain[outer[0]] == 1:
        raise Unsupported("cat/pad producing a single element along its dim")
    return inner, (outer[0] if outer else None)


class Needs(Unsupported):
    """A verdict: the program cannot be laid out as it is, and this rewrite of it would be
    (each subclass names one; ``backends/cute/legalize.py`` applies it). Raised inside this
    module, returned across it (``geometry_or_needs``)."""


class NeedsColumnsApart(Needs):
    """A row program with sums per column that the row kernel cannot take: its rows are not
    innermost, split across blocks or too long for registers, or its sums would hold too many
    registers. The sums run as a reduction of their own (``expr.columns_apart``)."""


def geometry_or_needs(prog: Program, env: dict, store_tensors: list[torch.Tensor], iotas: dict | None = None,
                      sm_count: int = 132) -> Geometry | Needs:
    """``build_geometry``'s layout of ``prog``, or the rewrite it needs first (a ``Needs``
    verdict, returned); a program no rewrite helps raises ``Unsupported``."""
    try:
        return build_geometry(prog, env, store_tensors, iotas, sm_count)
    except Needs as verdict:
        return verdict


def build_geometry(prog: Program, env: dict, store_tensors: list[torch.Tensor], iotas: dict | None = None,
                   sm_count: int = 132) -> Geometry:
    """``env`` maps ``id(Value)`` to the segment input tensors; ``store_tensors`` are the
    tensors each store writes (freshly allocated outputs, or the ``out`` of a write);
    ``iotas`` gives ``(start, step)`` of the loaded values a kernel may compute instead;
    ``sm_count`` the GPU's multiprocessors (an H100's without one), for splitting rows."""
    if not prog.across:
        return _build_geometry(prog, env, store_tensors, iotas, sm_count)
    try:
        geo = _build_geometry(prog, env, store_tensors, iotas, sm_count)
    except Unsupported as e:  # any rewrite the rows need, they take apart from the sums
        raise NeedsColumnsApart(f"its rows do not run as one row kernel: {e}") from e
    if geo.columns or geo.split_rows or geo.looped:
        what = "columns" if geo.columns else "split across blocks" if geo.split_rows else "too long for registers"
        raise NeedsColumnsApart(f"its rows are {what}")
    held = geo.row_vectors * geo.vector * len(column_sums(prog))
    if held > COLUMN_SUM_REGISTERS:
        raise NeedsColumnsApart(f"its sums per column would hold {held} fp32 registers per thread "
                                f"(at most {COLUMN_SUM_REGISTERS})")
    geo.across, geo.splits = True, across_splits(geo, sm_count, held)
    return geo


def _build_geometry(prog: Program, env: dict, store_tensors: list[torch.Tensor], iotas: dict | None,
                    sm_count: int, columns_ok: bool = True) -> Geometry:
    """``columns_ok=False``: a reduction whose kept dims are innermost is laid out as rows
    all the same (its kept dims lie on both sides of the reduced ones in memory)."""
    iotas = iotas or {}
    domain = prog.domain
    if not math.prod(domain):
        raise Unsupported("an empty domain (nothing to launch)")
    row_dims = set(prog.reduced)  # the dims a row value is broadcast along in its view
    reduced = row_dims if prog.family == "rows" else set()  # the dims the kernel reduces
    bases: list[torch.Tensor] = []

    def base_index(t: torch.Tensor) -> int:
        for i, b in enumerate(bases):
            if b is t:
                return i
        bases.append(t)
        return len(bases) - 1

    load_view = {}
    merges = []  # loads whose trailing merge of dims needs a copy at these strides
    for ld in prog.loads:
        base = env[id(ld.source)]
        if not isinstance(base, torch.Tensor):
            raise Unsupported(f"{ld.source.name} is not a tensor")
        try:
            v = _view(base, ld.views)
        except Unsupported as e:
            if prog.family != "pointwise" or trailing_merge(ld) is None:
                raise
            merges.append((ld, str(e)))
            continue
        if ld.shifts:
            shifted = {d for d, _ in ld.shifts}
            others = [d for d in range(len(domain)) if d not in shifted]
            if v.ndim != len(domain) or any(v.shape[d] != domain[d] for d in others):
                raise Unsupported(f"a piece of {ld.source.name} {tuple(v.shape)} does not span the domain {domain}")
        else:
            v = _domain_view(v, domain, row_dims, ld.row, ld.source.name)
        load_view[id(ld)] = (v, base_index(base))
    if merges:
        raise NeedsUnmerge(merges[0][1], [ld for ld, _ in merges])
    store_views = []
    for st, t in zip(prog.stores, store_tensors):
        if st.across:  # one value per column: broadcast along the across dims
            v = _domain_view(t, domain, set(prog.across), True, st.target.name)
        else:
            v = _domain_view(t, domain, row_dims, st.is_row, st.target.name)
        store_views.append((v, base_index(t)))

    full_stores = [v for (v, _), st in zip(store_views, prog.stores) if not st.is_row and not st.across]
    full_loads = [load_view[id(ld)][0] for ld in prog.loads if not ld.row]
    ref = full_stores[0] if full_stores else (full_loads or [next(iter(load_view.values()))[0]])[0]
    if ref.ndim != len(domain):
        ref = store_views[0][0]
    columns = columns_ok and prog.family == "rows" and _kept_innermost(ref, reduced)
    if columns:
        _check_two_launch_program(prog, "a column reduction")
    inner_sel, outer_sel = _select_axes(prog, ref, domain)
    sels = set(prog.select_dims)
    order = _order(ref, reduced, inner_sel, outer_sel, columns)
    if columns:
        fixed_inner = len(reduced)
    else:  # a forced innermost run: the reduced dims, or the inner select dim
        fixed_inner = len(order) - (len(reduced) if reduced else (1 if inner_sel is not None else 0))

    all_views = [v for v, _ in load_view.values()] + [v for v, _ in store_views]
    # drop size-1 dims, then merge neighbours every operand walks through as one dim
    groups: list[list[int]] = []
    for pos, d in enumerate(order):
        if domain[d] == 1:
            continue
        boundary = pos == fixed_inner or d in sels
        if groups and not boundary and groups[-1][-1] not in sels:
            a = groups[-1][-1]
            if all(v.stride(a) == v.stride(d) * v.shape[d] for v in all_views):
                groups[-1].append(d)
                continue
        groups.append([d])
    if not groups:
        groups = [[order[-1]]] if order else []
    if columns:
        kept_groups = [g for g in groups if g[0] not in reduced]
        if len(kept_groups) != 1:
            why = "the kept dims of a column reduction are not one contiguous run for every operand"
            if not all(v.dtype.itemsize <= 2 for v, _ in load_view.values()):
                raise Unsupported(why)
            # kept dims on both sides of the reduced ones in memory (falcon-7b's key gradient
            # [b, s, 71, e] summed over its 71 query heads): no column kernel walks two kept
            # runs. As rows, the kernel reads its operands across the rows, which a transposing
            # copy stages first (``NeedsTranspose``): 6 bytes moved per 16-bit element (read,
            # write, read), where the reference backend widens to fp32 in memory and sums (10:
            # falcon-7b's 16 such sums a step took 1.7 ms on the H100). An fp32 operand stays on
            # the reference backend, whose one sum reads it once (4 bytes against 12).
            try:
                return _build_geometry(prog, env, store_tensors, iotas, sm_count, columns_ok=False)
            except Needs:
                raise
            except Unsupported as e:
                raise Unsupported(f"{why}, nor as rows: {e}") from e
    elif reduced:
        inner_groups = [g for g in groups if g[0] in reduced]
        if len(inner_groups) != 1:
            if prog.family == "rows" and groups and groups[-1][0] in reduced:
                _check_two_launch_program(prog, f"the reduced dims {sorted(reduced)} in runs apart")
                inner = tuple(sorted(set(groups[-1]) | {d for d in reduced if domain[d] == 1}))
                kept = [d for d in order if d not in reduced]
                raise NeedsStages(f"the reduced dims {sorted(reduced)} are runs apart in memory", inner,
                                  tuple(kept + [d for d in order if d in reduced and d not in inner] + list(inner)))
            raise Unsupported(f"the reduced dims {sorted(reduced)} are not one contiguous run for every operand")
        if groups[-1] is not inner_groups[0]:
            raise Unsupported("the reduced dims are not innermost")
    outer_groups, inner_group = groups[:-1] if groups else [], groups[-1] if groups else []

    def coalesce(v: torch.Tensor):
        shape, stride = [], []
        for g in reversed(outer_groups):  # innermost-first for CuTe's colexicographic order
            shape.append(math.prod(v.shape[d] for d in g))
            stride.append(v.stride(g[-1]))
        if inner_group:
            shape.append(math.prod(v.shape[d] for d in inner_group))
            stride.append(v.stride(inner_group[-1]))
        else:
            shape.append(1)
            stride.append(1)
        return tuple(shape), tuple(stride)

    operands: list[Operand] = []
    load_slot: dict[int, int] = {}

    def add(v: torch.Tensor, is_store: bool, bidx: int, iota=None) -> int:
        shape, stride = coalesce(v)
        off = v.storage_offset() - bases[bidx].storage_offset()
        op = Operand(bidx, shape, stride, off, is_store, v.dtype, iota and iota + (off,))
        if not is_store:
            for i, o in enumerate(operands):
                if o == op:
                    return i
        operands.append(op)
        return len(operands) - 1

    for ld in prog.loads:
        v, b = load_view[id(ld)]
        load_slot[id(ld)] = add(v, False, b, iotas.get(id(ld.source)))
    store_slot = [add(v, True, b) for v, b in store_views]
    outer = tuple(math.prod(domain[d] for d in g) for g in outer_groups)
    n = math.prod(domain[d] for d in inner_group) if inner_group else 1

    if not GATHER_ROWS and prog.family == "rows" and not columns and any(
        o.inner_mode == "gather" and not o.is_store for o in operands
    ):
        raise Unsupported("a reduction over dims that are innermost for some operands and not for others")
    vector = widest = vector_width(operands)
    inner_bounds = _select_bounds(prog, inner_sel)  # pieces along the vector dim must hold whole vectors
    while vector > 1 and not _vector_fits(vector, operands, bases, n, bool(outer) or prog.family == "rows", inner_bounds):
        vector //= 2
    tail = n % vector != 0
    geo = Geometry(
        operands, load_slot, store_slot, outer, n, vector, tail, bases=bases, columns=columns,
        outer_select_dim=outer_sel,
    )
    _call_recipe(geo)
    if prog.family == "rows" and not columns:
        _check_rows_read_in_vectors(prog, geo, order)
    if columns:
        geo.col_vectors = min(32, 1 << max(0, (-(-n // vector) - 1).bit_length()))
        geo.splits = column_splits(geo, sm_count, any(e.op == "var" for e in reductions_in_order(prog)))
    elif prog.family == "rows" and (splits := rows_to_split(geo, sm_count)):
        _check_two_launch_program(prog, f"{math.prod(outer)} long row(s) split across blocks")
        split_row_tiling(geo, splits)
    elif prog.family == "rows":
        row_tiling(geo, sm_count, reads_rows_once(prog))
    geo.index64 = needs_64bit_indices(geo, prog.family)
    pointwise = prog.family != "rows" and outer_sel is None
    rows = bool(geo.row_threads) and not geo.split_rows and not prog.across  # looped or in registers
    if geo.index64:
        pass  # the plain pointwise template alone: its tiled variants index in 32 bits
    elif (rows or (pointwise and not prog.select_dims)) and flat_rows(geo, widest, pointwise):
        geo.vector, geo.flat = widest, True
        if rows:  # wider vectors: fewer per thread, and a row looped for its narrow ones may fit registers
            row_tiling(geo, sm_count, reads_rows_once(prog))
        _call_recipe(geo)  # the pointer checks of the wider vector
    elif pointwise:
        geo.stage = transpose_stage(prog, geo)
        geo.reuse = () if geo.stage else broadcast_reuse(geo)
    return geo




def needs_64bit_indices(geo: Geometry, family: str) -> bool:
    """Does this call's geometry need 64-bit index arithmetic? Offsets are 64-bit already
    (every stride but 0 and 1 is a 64-bit symbol, so a row's offset is a 64-bit product);
    what overflows 32 bits is an extent (one coalesced dim of 2**31 elements: a contiguous
    tensor of that size is one), a base tensor's extent, or the count of vectors a
    pointwise kernel gives its threads. Chosen per call, so that every smaller tensor keeps
    32-bit arithmetic; the pointwise template (and its cat/pad pieces) runs either way, the
    row and column families raise ``Unsupported`` (torch runs the segment): a reduction over
    that many elements reaches them in stages of fewer (``ir/long_reductions.py``), so what
    is left to torch is a row or column count past 2**31, or a dim of prime length."""
    if family == "rows":  # a long base dim is passed as a view instead (``_call_recipe``)
        extents = list(geo.outer) + [geo.n]
        if max(extents) < INT32_LIMIT:
            return False
    else:
        extents = list(geo.outer) + [geo.n] + [e for b in geo.bases for e in b.shape]
        vectors = math.prod(geo.outer) * max(1, -(-geo.n // geo.vector))
        if max(extents, default=0) < INT32_LIMIT and vectors < INT32_LIMIT:
            return False
    if family == "rows":
        raise Unsupported(f"a dim of {max(extents):,} elements: the row and column kernels index their "
                          "extents in 32 bits, torch runs the segment")
    return True


def vector_width(operands: list, by_stores: bool | None = None) -> int:
    """Elements per vector: 16 bytes of the narrowest operand accessed in vectors, at most
    16 bytes of the widest such store (``VECTOR_BY_STORES``), at most MAX_VECTOR."""
    vec = [o.dtype.itemsize for o in operands if o.inner_mode == "vec"]
    if not vec:
        return 1
    stores = [o.dtype.itemsize for o in operands if o.inner_mode == "vec" and o.is_store]
    vector = min(MAX_VECTOR, max(1, 16 // min(vec)))
    if stores and (VECTOR_BY_STORES if by_stores is None else by_stores):
        vector = min(vector, max(1, 16 // max(stores)))
    return vector


def flat_rows(geo: Geometry, vector: int, pointwise: bool = False) -> bool:
    """Whether a kernel narrowed below ``vector`` (rows of odd length: a row starts 16 bytes
    apart from the last only every few rows) can still load and store whole vectors of the
    flat run of its rows, where they lie back to back (``Operand.back_to_back``, the first
    element aligned to the vector):
    - a row kernel, looped or holding its row in registers, every operand written along the
      rows so: it takes the vectors of the run that overlap its row, an aligned middle and an
      edge vector at each end shared with the neighbouring rows, whose elements it reads and
      writes one by one (``rows.build_rows``). Operands read once per row (a row value,
      a broadcast) are as they are; a weight every row reads along N (which the row's shift
      misaligns) element by element; any other operand not back to back is not. A row in
      registers of FLAT_MIN_VECTORS vectors or more (a looped row is longer);
    - a pointwise kernel (rows of at least ``vector`` elements, its stores so): a thread
      computes one vector of the run, which may span two rows; the operands not so (a bias
      along the rows, a value per row) are read element by element at
      each element's row and column (``pointwise._flat_pointwise_pieces``: Inductor's
      flat index).
    An iota is computed at each element's row and column. Not with a cat/pad or an operand
    strided along N (which ``transpose_stage`` may stage)."""
    if not FLAT_ROWS or geo.vector >= vector or vector <= 1 or len(geo.outer) != 1 or geo.outer_select:
        return False
    if geo.n < vector or (geo.row_vectors and geo.n < FLAT_MIN_VECTORS * vector):
        return False
    rows = geo.outer[0]
    for o in geo.operands:
        if o.iota is not None:
            # computed from each element's row and column (a cross-entropy's column index):
            # in a pointwise kernel any iota, in a row kernel one that is the same every row
            if not (pointwise or o.inner_mode == "bcast" or (o.inner_mode == "vec" and o.same_every_row)):
                return False
            continue
        if o.back_to_back(rows, geo.n):
            if not _base_aligned(o, geo.bases, vector):
                return False
        elif o.is_store and (pointwise or o.inner_mode != "bcast"):  # stored: back to back, or row values
            return False
        elif not (o.inner_mode == "bcast" or (o.inner_mode == "vec" and (pointwise or o.same_every_row))):
            return False  # read as it is, or element by element: a pointwise operand along N, a row's weight
    return True


def _select_bounds(prog: Program, dim: int | None) -> tuple:
    """The bounds of every cat/pad along domain dim ``dim``."""
    from thunder_fuser.backends.cute.lower.expr import Select, subexpressions

    exprs = subexpressions(st.expr for st in prog.stores)
    return tuple(e.bounds for e in exprs if isinstance(e, Select) and e.dim == dim)


def _vector_fits(vector, operands, bases, n, has_outer, bounds) -> bool:
    if has_outer and n % vector:
        return False
    if any(b % vector for bs in bounds for b in bs):
        return False
    for o in operands:
        if o.inner_mode != "vec":
            continue
        if o.shape[-1] % vector and o.shape[-1] != n:
            return False
        if any(s % vector for s in o.stride[:-1]):
            return False
        if not _base_aligned(o, bases, vector):
            return False
    return True


def _base_aligned(o: Operand, bases, vector: int) -> bool:
    """Whether operand ``o``'s first element is aligned to a vector of ``vector`` elements."""
    return (bases[o.source].data_ptr() + o.offset * o.dtype.itemsize) % (vector * o.dtype.itemsize) == 0


def _call_recipe(geo: Geometry) -> None:
    """What a call needs beyond the base tensors, computed once: which operands are their
    base tensor as it is (passed without a view, or beside the element offset of their first
    element), the view of the others, and which base pointers to check."""

    def view(o):
        b = geo.bases[o.source]
        if o.offset == 0 and tuple(b.shape) == o.shape and b.stride() == o.stride:
            return None
        return (o.shape, o.stride, o.offset)

    def mappable(o):
        """A base map names the base's extents, which a kernel of 32-bit indices cannot hold
        past 2**31 (a 1-D tensor of 2**32 elements read as ``[4096, 2**20]`` rows): then the
        call passes the operand's view."""
        return geo.index64 or max(geo.bases[o.source].shape, default=0) < INT32_LIMIT

    ops = geo.operands
    views = [view(o) for o in ops]
    geo.map_ref = choose_map_ref(geo)
    maps = [None] * len(ops)
    for i in ref_first(len(ops), geo.map_ref):
        if views[i] is not None and mappable(ops[i]):
            ref = None if i == geo.map_ref else ops[geo.map_ref]
            maps[i] = mode_map(ops[i], geo.bases[ops[i].source], ref, static_modes(geo, ops[i]))
    geo.base_maps = tuple(maps)
    geo.call_views = tuple((o.source, (o.offset if m.offset else None) if m else v) for o, m, v in zip(ops, maps, views))
    if geo.vector > 1:
        geo.align_checks = tuple(
            (o.source, o.offset * o.dtype.itemsize, geo.vector * o.dtype.itemsize)
            for o in geo.operands if vector_access(geo, o)
        )


def operand_align(geo: Geometry, o: Operand) -> int:
    """The bytes ``o``'s first element is aligned to, as the kernel assumes it: one vector
    (at most 16 bytes) where it moves vectors, else one element."""
    return min(16, geo.vector * o.dtype.itemsize) if vector_access(geo, o) else o.dtype.itemsize


def vector_access(geo: Geometry, o: Operand) -> bool:
    """Whether the kernel reads or writes ``o`` a vector at a time (its pointer aligned to
    one): along a stride-1 N, except, in a flat run (``flat_rows``), an operand not back to
    back, which it reads element by element."""
    return o.inner_mode == "vec" and (not geo.flat or o.back_to_back(geo.outer[0], geo.n))


class NeedsTranspose(Needs):
    """A row reduction reads operands (``loads``) contiguous across its rows: it runs as a
    pointwise program that copies them, staged through shared memory, into temporaries in
    dim order ``order`` (its rows'), then the reduction reading those
    (``expr.transpose_first``)."""

    def __init__(self, message: str, loads: list, order: tuple):
        super().__init__(message)
        self.loads, self.order = loads, order


def _check_rows_read_in_vectors(prog: Program, geo: Geometry, order) -> None:
    """NeedsTranspose where a row reduction would read an operand element by element
    along its rows that a pointwise kernel could stage (``transpose_stage``) and that spans
    the whole domain (a broadcast one's copy would be larger than itself)."""
    stage = transpose_stage(prog, geo)
    slots = {i for i in stage[1] if 0 not in geo.operands[i].stride} if stage else set()
    loads = [ld for ld in prog.loads if geo.load_slot[id(ld)] in slots and not ld.row]
    if loads:
        names = ", ".join(ld.source.name for ld in loads)
        raise NeedsTranspose(f"{names} contiguous across the rows of a reduction", loads, tuple(order))


class NeedsStages(Needs):
    """A row reduction whose reduced dims are runs apart in memory (a batch norm's
    statistics over N, H and W of an NCHW tensor): it runs in two stages
    (``expr.reduce_in_stages``), first over ``inner`` (the innermost run, a row kernel
    over the domain), into fp32 partials laid out in dim order ``order`` (the kept dims,
    then the other reduced ones innermost), then over the other reduced dims, a row
    kernel again, reading the partials."""

    def __init__(self, message: str, inner: tuple, order: tuple):
        super().__init__(message)
        self.inner, self.order = inner, order


class NeedsUnmerge(Needs):
    """A pointwise program reads operands (``loads``) through a merge of dims that their
    strides cannot walk as one (a gradient whose heads interleave repeats, merged with the
    head dim): it iterates over the dims before the merge instead (``expr.unmerged``)."""

    def __init__(self, message: str, loads: list):
        super().__init__(message)
        self.loads = loads


class NeedsSplit(Needs):
    """A column program, or one whose rows split across blocks, stores values computed from
    its own reductions over the whole domain: it runs as two programs
    (``expr.split_at_reductions``)."""


def _check_two_launch_program(prog: Program, what: str) -> None:
    """A column reduction, or a row reduction split across blocks, finishes its reductions
    only after every block is done (a second launch combines the blocks' partial results),
    so no other reduction and nothing stored over the whole domain may depend on one:
    NeedsSplit otherwise (``expr.split_at_reductions``)."""
    if any(has_reduce(e.arg) for e in reductions_in_order(prog)):
        raise NeedsSplit(f"{what}, and a reduction inside another's argument")
    for st in prog.stores:
        if not st.is_row and has_reduce(st.expr):
            raise NeedsSplit(f"{what}, and {st.target.name} computed from a reduction over the whole domain")
