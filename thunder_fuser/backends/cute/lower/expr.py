"""A segment as one expression per stored value: what a generated kernel computes.

Every kernel family reads and writes *operands*: strided views of tensors over the
segment's iteration domain. Lowering pushes each view op (broadcast, reshape, permute,
squeeze) and each slice down through the pointwise ops to the tensors it reaches, because
pointwise ops commute with them: ``reshape(a * b) == reshape(a) * reshape(b)``. What stays
is a tree of pointwise ops over loads, and, in row kernels, reductions whose results are one
number per row. The kernel template then needs no index algebra at all; the strides of
each operand carry it, and they are derived per producer-to-consumer edge (each push
applies exactly the op on that edge), never from a global equivalence of dims.

``cat`` and ``pad`` become :class:`Select` (pick a piece by the position along one dim;
a pad of several dims is one select per dim, nested); each piece reads its operands shifted
by the piece's start along that dim. Selects nest freely (a pad of a cat): shifting a
select moves its bounds, and a load's shifts along one dim add up.

Anything outside this vocabulary raises :class:`Unsupported` with the reason, and the
segment runs on the reference backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from thunder_fuser.backends.cute.lower.constants import Iotas, fill_number, find_iotas, number_op, typed_number
from thunder_fuser.backends.cute.unsupported import Unsupported
from thunder_fuser.ir.ops import METADATA, POINTWISE, REDUCTION
from thunder_fuser.ir.region import Node, Value
from thunder_fuser.layout import strides_for_order
from thunder_fuser.segment import Segment
from thunder_fuser.segment.segmenter import seg_kind
from thunder_fuser.segment.views import alias_views


@dataclass(frozen=True, eq=False)
class Load:
    """Read ``source`` through ``views`` (nodes applied in order, each to the previous
    result). ``shifts``: for a read inside cat/pad pieces, (domain dim, start) per dim it is
    shifted along, sorted by dim: its element ``i`` sits at ``i + start`` of the domain, and
    it reads as zero outside its extent there."""

    source: Value
    views: tuple[Node, ...] = ()
    shifts: tuple[tuple[int, int], ...] = ()
    row: bool = False  # one value per reduced-away position (a reduction result), broadcast


@dataclass(frozen=True, eq=False)
class Op:
    op: str
    args: tuple  # Expr or Python number
    dtype: object  # the value's dtype as thunder inferred it


@dataclass(frozen=True, eq=False)
class Reduce:
    """One number per row: ``op`` over the row of ``arg``. ``part`` picks var or mean of
    ``var_mean``. ``across``: one number per column instead, over the program's ``across``
    dims (a sum per column that a row kernel takes beside its rows)."""

    op: str
    arg: object
    dtype: object
    correction: float = 0.0
    part: int = 0
    across: bool = False


@dataclass(frozen=True, eq=False)
class Select:
    """Along domain dim ``dim``, ``pieces[i]`` covers ``[bounds[i], bounds[i+1])``;
    elsewhere (pad) the value is ``fill``."""

    pieces: tuple
    bounds: tuple[int, ...]
    fill: object
    dtype: object
    dim: int


@dataclass(frozen=True, eq=False)
class Reshaped:
    """A cat/pad result, spanning ``shape``, under a reshape that merges or splits its
    select dim (``ir/cat_before_reshape.py`` makes these). A reshape only renumbers the
    elements in row-major order, and a store views its target over the domain the same
    way, so such a value can be stored (over ``shape``) but not computed with."""

    expr: object
    shape: tuple[int, ...]


@dataclass
class Store:
    """Write ``expr`` into ``target`` (viewed as the domain through ``views``)."""

    target: Value
    expr: object
    views: tuple[Node, ...] = ()
    is_row: bool = False  # one number per row (a reduction result or a function of them)
    domain: tuple[int, ...] | None = None  # the shape ``expr`` spans, where not the target's
    across: bool = False  # one number per column (a sum per column or a function of them)


@dataclass
class Program:
    family: str  # pointwise | rows
    domain: tuple[int, ...]
    reduced: tuple[int, ...]  # dims reduced (rows), or that row loads broadcast along (pointwise)
    stores: list[Store]
    loads: list[Load] = field(default_factory=list)  # distinct loads, in first-use order
    select_dims: tuple[int, ...] = ()  # the domain dims cat/pad select along (at most two)
    across: tuple[int, ...] = ()  # rows: the dims its sums per column reduce (the kept ones' complement)


def is_row(e) -> bool:
    """One value per row (per kept position): a reduction, a row-shaped input, or an op
    over only those."""
    return _one_per(e, columns=False)


def is_column(e) -> bool:
    """One value per column: a sum per column, or an op over only those (and numbers)."""
    return _one_per(e, columns=True)


def _one_per(e, columns: bool) -> bool:
    if isinstance(e, Reduce):
        return e.across == columns
    if isinstance(e, Load):
        return e.row and not columns
    if isinstance(e, Op):
        tensors = [a for a in e.args if not _is_number(a)]
        return bool(tensors) and all(_one_per(a, columns) for a in tensors)
    return False


def _is_number(a) -> bool:
    return isinstance(a, (bool, int, float))


_F32 = torch.float32
_SUPPORTED_POINTWISE = frozenset(POINTWISE) - {"full", "iota"}
_SUPPORTED_REDUCTIONS = frozenset(("sum", "amax", "amin", "prod", "var", "var_mean"))
# the row, column and split kernels accumulate in fp32: exact for these operands' values alone
# (an fp64 sum in fp32 loses 29 bits; an integer sum past 2**24 is rounded, where eager's is exact)
_REDUCED_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))


def _exact_in_fp32(arg, count: int) -> bool:
    """Does an fp32 accumulator give eager's reduction of expression ``arg`` over ``count``
    elements? For 32-bit and narrower floats (eager accumulates them in fp32 too), and for
    a count of booleans (a mask's, a loss's valid targets: integers converted from bool),
    exact below 2**24; an fp64 sum in fp32 would lose 29 bits, an integer sum would round
    past 2**24 where eager's is exact."""
    dt = dtype_of(arg)
    if dt in _REDUCED_DTYPES:
        return True
    while isinstance(arg, Op) and arg.op == "convert_element_type" and not dtype_of(arg).is_floating_point:
        arg = arg.args[0]
    return dtype_of(arg) == torch.bool and count <= 2**24


def _read_by_no_kernel(seg: Segment, made_by_torch) -> set[int]:
    """Ids of the view nodes torch makes after the kernel (``alias_views``) whose outputs no
    op the kernel computes reads: nothing to lower (a weight gradient's transposed operand
    of a cat's reshaped result has no expression, and needs none)."""
    readers: dict[int, list] = {}
    for n in seg.nodes:
        for v in n.inputs():
            readers.setdefault(id(v), []).append(n)
    skip: set[int] = set()
    for n in reversed(made_by_torch):
        if all(id(r) in skip for o in n.outputs for r in readers.get(id(o), ())):
            skip.add(id(n))
    return skip


def lower_segment(seg: Segment, iotas: Iotas | None = None, orders: dict | None = None) -> list[Program]:
    """The programs of a pointwise, reduction, normalization or resize segment: one per
    shape of the values it stores (a segment may fuse siblings of different shapes, such as
    the RoPE of q and of k), each a kernel launch. ``iotas`` (``constants.find_iotas``)
    are read as operands, computed once per plan. ``orders``: the plan's layouts of the
    outputs (value id -> dims outermost first), where known: an output that is a reshape of
    a value of another stored shape is stored over that shape where its layout allows
    (``_stored_before_reshape``)."""
    if seg.kind in ("pointwise", "transpose", "resize"):
        family = "pointwise"
    elif seg.kind in ("reduction", "normalization"):
        family = "rows"
    else:
        raise Unsupported(f"no kernel template for a {seg.kind} segment")
    iotas = iotas or find_iotas(seg.nodes, seg.outputs)
    lw = _Lowering(seg, iotas)
    made_by_torch = alias_views(seg)
    skip = {id(n) for n in iotas.nodes} | _read_by_no_kernel(seg, made_by_torch)
    for node in seg.nodes:
        if id(node) not in skip:
            lw.node(node)
    views = {id(o) for n in made_by_torch for o in n.outputs}
    stores = []
    for o in seg.outputs:
        if id(o) in lw.writes or id(o) in views:
            continue
        if not o.is_tensor:
            raise Unsupported(f"output {o.name} is a number")
        e = lw.value(o)
        if isinstance(e, Reshaped):
            stores.append(Store(o, e.expr, domain=e.shape))
            continue
        stores.append(Store(o, e, is_row=is_row(e), across=is_column(e)))
    stores.extend(lw.store_writes)
    for st in stores:  # a row value stored over the whole domain (a saved broadcast) is a full store
        if st.is_row and st.target.numel == _numel(seg.domain):
            st.is_row = False
        if st.across and st.target.numel == _numel(seg.domain):
            raise Unsupported(f"{st.target.name}, a sum per column, stored over the whole domain")
    if family == "rows":
        prog = Program(family, tuple(seg.domain), tuple(seg.reduced or ()), stores, across=tuple(seg.across or ()))
        _collect_loads(prog)
        if not any(s.is_row or has_reduce(s.expr) for s in stores):
            raise Unsupported("a row kernel with no reduction")
        return [prog]
    if orders is not None:
        stores = _stored_before_reshape(seg, lw, stores, orders)
    groups: dict[tuple, list[Store]] = {}
    for st in stores:
        # a store of a broadcast merged into another dim iterates over the dims before the
        # merge (``geometry.NeedsUnmerge``, ``unmerged``), not its siblings': a launch of its own
        merging = any(_merges_a_broadcast(ld) for ld in subexpressions([st.expr]) if isinstance(ld, Load))
        groups.setdefault((st.domain or tuple(st.target.shape), merging), []).append(st)
    progs = []
    for (shape, _), group in groups.items():
        dims = sorted({e.dim for e in subexpressions(st.expr for st in group) if isinstance(e, Select)})
        if len(dims) > 2:
            raise Unsupported(f"cat/pad along {len(dims)} dims {dims} in one kernel (at most 2)")
        prog = Program(family, shape, (), group, select_dims=tuple(dims))
        _collect_loads(prog)
        progs.append(prog)
    return progs


def _stored_before_reshape(seg: Segment, lw, stores: list, orders: dict) -> list:
    """``stores``, each output that a reshape in the segment made from a value of another
    stored shape stored over that shape instead (its target viewed over it in row-major
    order, as a cat under a reshape is), so that it joins their program: one launch reads
    the operands once. In a SwiGLU's backward the gradient of the up projection is stored
    as the [tokens, hidden] matrix its matmuls read, the gate's as [batch, seq, hidden]:
    two launches, reading the gradient and the gate twice (2 of 7 tensors' traffic more).
    Only where the output's layout takes the view (a fresh output in the plan's order)."""
    shapes = {st.domain or tuple(st.target.shape) for st in stores}
    made_by = {id(n.output): n for n in seg.nodes if n.outputs}
    out = []
    for st in stores:
        found = None if st.domain or st.is_row or st.across else _after_reshape(st.target, made_by)
        if found is not None:
            src, chain = found
            e = lw.value(src) if src.is_tensor else None  # a value the segment made, or an input's load
            if (tuple(src.shape) in shapes - {tuple(st.target.shape)} and e is not None
                    and not isinstance(e, Reshaped) and _views_as(st.target, orders, tuple(src.shape))):
                for node in chain:  # the elementwise ops after the reshape, applied before it
                    args = node.args[:1] if node.op == "convert_element_type" else node.args
                    e = _pointwise(node.op, tuple(a if _is_number(a) else e for a in args), node.output.dtype)
                st = Store(st.target, e, domain=tuple(src.shape))
        out.append(st)
    return out


def _after_reshape(v: Value, made_by: dict) -> tuple | None:
    """(the source of a reshape, the elementwise ops of one tensor each that follow it up
    to ``v``, in order) where ``v`` is made so in the segment, else None."""
    chain = []
    node = made_by.get(id(v))
    while node is not None and node.op != "reshape":
        tensors = [a for a in node.args if isinstance(a, Value) and a.is_tensor]
        if node.op not in POINTWISE or len(tensors) != 1 or tuple(tensors[0].shape) != tuple(v.shape):
            return None
        if any(not _is_number(a) for a in node.args if not (isinstance(a, Value) and a.is_tensor)) \
                and node.op != "convert_element_type":
            return None
        chain.append(node)
        node = made_by.get(id(tensors[0]))
    if node is None or not isinstance(node.args[0], Value):
        return None
    return node.args[0], chain[::-1]


def planned_strides(v: Value, orders: dict) -> tuple:
    """The strides of fresh output ``v`` in the plan's order for it (row-major where none)."""
    return strides_for_order(v.shape, orders.get(id(v)) or tuple(range(len(v.shape))))


def _views_as(v: Value, orders: dict, shape: tuple) -> bool:
    """Does ``v``, allocated in its planned order, view as ``shape`` (torch's rule)?"""
    try:
        torch.empty_strided(tuple(v.shape), planned_strides(v, orders), device="meta").view(shape)
    except RuntimeError:
        return False
    return True


def trailing_merge(ld: Load) -> tuple[tuple, int, list] | None:
    """Where ``ld``'s views end with a reshape that merges dims, followed by transposes
    only: the views (``ld.views``, else ``_collapsed``'s), that reshape's index among them,
    and the dims it merges per dim of its result. None elsewhere."""
    found = _trailing_merge(ld.views)
    if found is None and _collapsible(ld.views):
        found = _trailing_merge(_collapsed(ld.views))
    return found


def _trailing_merge(views: tuple) -> tuple[tuple, int, list] | None:
    for i in range(len(views) - 1, -1, -1):
        node = views[i]
        if node.op == "transpose":
            continue
        if node.op != "reshape":
            return None
        before = tuple(node.args[0].shape)
        groups = _merge_groups(before, tuple(node.args[1]))
        if groups is None or not any(len([d for d in g if before[d] != 1]) > 1 for g in groups):
            return None
        return views, i, groups
    return None


def _only_ones_inserted(node) -> bool:
    """A ``broadcast_in_dim`` that only inserts dims of one (an ``unsqueeze``)."""
    before, shape, bdims = tuple(node.args[0].shape), tuple(node.args[1]), tuple(node.args[2])
    return (list(bdims) == sorted(bdims) and all(shape[b] == before[k] for k, b in enumerate(bdims))
            and all(shape[j] == 1 for j in range(len(shape)) if j not in bdims))


def _squeezing(node) -> bool:
    return node.op == "reshape" or (node.op == "broadcast_in_dim" and _only_ones_inserted(node))


def _collapsible(views: tuple) -> bool:
    """Do two neighbours of ``views`` make a run ``_collapsed`` takes as one reshape?"""
    return any(_squeezing(a) and _squeezing(b) for a, b in zip(views, views[1:]))


def _collapsed(views: tuple) -> tuple:
    """``views`` with each run of reshapes, and of broadcasts that only insert dims of one,
    as one reshape of the run's first input to its last output. At batch 1 thunder writes
    the grouped-query expand's backward as a sum over two dims of one, and its
    ``small_reductions`` rewrite reads the value gradient through ``reshape``, an unsqueeze,
    a squeeze, another unsqueeze, a transpose, then two reshapes: the merge no stride walks
    is the first of the last two (``[1, s, g, e] -> [1, s, g * e]``), and the second only
    drops the batch dim of one. As one reshape, the merge ends the views
    (``trailing_merge``), as it does at batch 2."""
    out: list = []
    for node in views:
        if not _squeezing(node):
            out.append(node)
            continue
        first = out.pop().args[0] if out and out[-1].op == "reshape" else node.args[0]  # the run's input
        if tuple(first.shape) != tuple(node.output.shape):
            out.append(Node("reshape", (first, tuple(node.output.shape)), {}, node.outputs))
    return tuple(out)


def _merges_a_broadcast(ld: Load) -> bool:
    """Does ``ld``'s trailing merge (``trailing_merge``) take a dim that an earlier broadcast
    expanded together with another dim (``k.expand(b, g, r, s, e).reshape(b, g * r, s, e)``:
    grouped-query attention's ``repeat_interleave``)? No stride walks such a merged dim:
    torch copies there, whatever the strides."""
    found = trailing_merge(ld)
    if found is None:
        return False
    views, i, groups = found
    expanded: set = set()
    for node in views[:i]:
        if node.op == "broadcast_in_dim":
            before, shape, bdims = node.args[0].shape, node.args[1], node.args[2]
            kept = {b for k, b in enumerate(bdims) if before[k] != 1 and k not in expanded}
            expanded = {j for j in range(len(shape)) if j not in kept and shape[j] != 1}
        elif node.op == "transpose":
            expanded = {j for j, p in enumerate(node.args[1]) if p in expanded}
        else:
            expanded = set()
    before = tuple(views[i].args[0].shape)
    return any(len([d for d in g if before[d] != 1]) > 1 and expanded & set(g) for g in groups)


def _merge_groups(before: tuple, after: tuple) -> list | None:
    """Per dim of ``after``, the dims of ``before`` it merges (neighbours, in order); None
    where the reshape splits a dim."""
    groups, d = [], 0
    for extent in after:
        group, n = [], 1
        while d < len(before) and n * before[d] <= extent and (n < extent or before[d] == 1):
            group.append(d)
            n *= before[d]
            d += 1
        if n != extent:
            return None
        groups.append(group)
    return groups if d == len(before) else None


def unmerged(prog: Program, loads: list) -> Program | None:
    """``prog`` iterating over the dims before the merge that ``loads`` end with
    (``trailing_merge``): a pointwise program whose operands merge dims no stride walks
    (the expanded ``k`` of grouped-query attention, which SDPA reads as ``[b, h, s, e]``;
    a gradient of a ``[b, s, h, e]`` tensor whose heads interleave repeats, merged back into
    ``[b, s, h * e]``) computes over ``[b, g, r, s, e]`` (``[b, s, g, e]``) instead. Every
    other operand, and every store, is viewed over that domain by splitting dims, which any
    strides allow, so the kernel writes the copy torch would make, fused with the ops before
    it. A cat or pad (selects, shifted loads) along a dim the merge leaves whole moves to
    that dim's place in the new domain (RoPE's ``k``, a cat, expanded so: a whole step of
    litgpt's Llama ran on torch through ThunderFX); along a dim the merge splits, it moves to
    the outermost of its dims where every piece starts and ends on a whole step of it (a
    fused projection's gradient: ``cat([dq, dk, dv], -1)`` of ``[b, s, h * e]`` merges of
    ``[b, h, s, e]`` gradients, pieces of whole heads). None where the loads disagree on
    the domain or the program cannot take it (a piece across steps of a split dim, rows)."""
    if prog.family != "pointwise" or prog.reduced or any(st.domain for st in prog.stores):
        return None
    table, domains, maps = {}, set(), set()
    for ld in loads:
        all_views, i, groups = trailing_merge(ld)
        merge = all_views[i]
        perm = list(range(len(groups)))
        for node in all_views[i + 1:]:
            perm = [perm[p] for p in node.args[1]]
        # the domain's dims, each split into the dims its reshape dim merged
        order = [d for p in perm for d in groups[p]]
        before = tuple(merge.args[0].shape)
        domain = [before[d] for d in order]
        place = {d: k for k, d in enumerate(order)}
        new_dims = tuple(tuple(place[d] for d in groups[p]) for p in perm)  # per old dim: its new dims
        for d, _ in ld.shifts:  # a piece of a cat spans its own extent there, the domain the whole
            step = _numel(domain[k] for k in new_dims[d][1:])  # of the outermost new dim, along d
            if prog.domain[d] % step:
                return None
            domain[new_dims[d][0]] = prog.domain[d] // step
        domain = tuple(domain)
        maps.add(new_dims)
        views = all_views[:i]
        if order != sorted(order):
            out = Value(f"{ld.source.name}_unmerged", domain, ld.source.dtype)
            views += (Node("transpose", (merge.args[0], tuple(order)), {}, (out,)),)
        table[id(ld)] = Load(ld.source, views, ld.shifts, ld.row)
        domains.add(domain)
    if len(domains) != 1 or len(maps) != 1:
        return None
    domain, new_dims = domains.pop(), maps.pop()
    if _numel(domain) != _numel(prog.domain):
        return None
    outer = {j: dims[0] for j, dims in enumerate(new_dims)}  # old dim -> its outermost new dim
    steps = {j: _numel(domain[k] for k in dims[1:]) for j, dims in enumerate(new_dims)}  # ... and its step
    for ld in prog.loads:
        if any(at % steps[d] for d, at in ld.shifts):
            return None
        if id(ld) not in table and ld.shifts:  # a piece of a cat: split like the domain, over its own extent
            shape = tuple(ld.views[-1].outputs[0].shape if ld.views else ld.source.shape)
            if any(shape[d] % steps[d] for d, _ in ld.shifts):
                return None
            split = tuple(e for j, dims in enumerate(new_dims)
                          for e in ((shape[j] // steps[j],) + tuple(domain[k] for k in dims[1:])))
            out = Value(f"{ld.source.name}_split", split, ld.source.dtype)
            last = ld.views[-1].outputs[0] if ld.views else ld.source
            table[id(ld)] = Load(ld.source, ld.views + (Node("reshape", (last, split), {}, (out,)),), ld.shifts, ld.row)
    table = {k: replace(ld, shifts=tuple(sorted((outer[d], at // steps[d]) for d, at in ld.shifts)))
             for k, ld in table.items()}
    swap = _substitution(table, "a merge is undone", dims=outer, steps=steps)
    out = Program(prog.family, domain, (), [replace(st, expr=swap(st.expr)) for st in prog.stores],
                  select_dims=tuple(sorted(outer[d] for d in prog.select_dims)))
    _collect_loads(out)
    return out


def column_sums(prog: Program) -> list:
    """The program's sums per column (``Reduce.across``), in first-use order."""
    return [e for e in reductions_in_order(prog) if e.across]


def columns_apart(prog: Program) -> list[Program]:
    """A row program with sums per column as two programs: the rows, then the sums per
    column as a reduction of their own over the ``across`` dims (a column reduction where
    the rows are innermost), which reads their operands again. What runs where the row
    kernel cannot take them (``geometry.NeedsColumnsApart``). Their arguments use no row
    reduction (the segmenter's rule), so the two are independent."""
    swap = _substitution({id(e): replace(e, across=False) for e in column_sums(prog)}, "sums per column run apart")
    rows = [st for st in prog.stores if not st.across]
    family = "rows" if any(st.is_row or has_reduce(st.expr) for st in rows) else "pointwise"
    programs = [Program(family, prog.domain, prog.reduced if family == "rows" else (), rows),
                Program("rows", prog.domain, prog.across,
                        [Store(st.target, swap(st.expr), is_row=True) for st in prog.stores if st.across])]
    for p in programs:
        _collect_loads(p)
    if any(ld.row for ld in programs[1].loads):
        raise Unsupported("a sum per column reads a value per row unbroadcast")
    return programs


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def children(e) -> tuple:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Reduce):
        return (e.arg,)
    if isinstance(e, Select):
        return e.pieces
    return ()


def subexpressions(roots, into_reductions: bool = True):
    """Every distinct expression reachable from ``roots`` (each once, parents first): the
    one walk that collecting loads, finding reductions and selects, and counting share.
    ``into_reductions=False`` stops at each reduction (yielded, its argument not): what a
    pass over the row reads for its own elements, not for a reduction it reads the result of."""
    seen: set[int] = set()
    stack = list(reversed(list(roots)))
    while stack:
        e = stack.pop()
        if _is_number(e) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if into_reductions or not isinstance(e, Reduce):
            stack.extend(reversed(children(e)))


def reductions_in_order(prog: Program) -> list:
    """Every reduction of the program, each after the reductions its argument uses."""
    order, seen = [], set()

    def visit(e):
        for x in subexpressions([e]):
            if isinstance(x, Reduce) and x is not e and id(x) not in seen:
                visit(x)
        if isinstance(e, Reduce) and id(e) not in seen:
            seen.add(id(e))
            order.append(e)

    for st in prog.stores:
        for x in subexpressions([st.expr]):
            if isinstance(x, Reduce):
                visit(x)
    return order


def split_at_reductions(prog: Program) -> list[Program]:
    """A reduction program whose full-domain stores depend on its own reductions, as two
    programs: the reductions (each stored to a temporary, one value per row or column),
    then a pointwise program that reads the temporaries broadcast. A column reduction, or
    rows split across blocks, needs this (a result exists only after every block is done);
    it costs one more read of the inputs the stores use. A program with a reduction inside
    another's argument (a softmax's sum of exp(x - max)) peels its first reductions off
    instead (``_peel_first_reductions``), and what is left may split again."""
    if any(has_reduce(e.arg) for e in reductions_in_order(prog)):
        return _peel_first_reductions(prog)
    full_dep = [st for st in prog.stores if not st.is_row and has_reduce(st.expr)]
    used = {id(x) for x in subexpressions(st.expr for st in full_dep)}
    stored, swap = _read_back(prog, [r for r in reductions_in_order(prog) if id(r) in used])
    stats = Program("rows", prog.domain, prog.reduced, [st for st in prog.stores if st not in full_dep] + stored)
    apply = Program("pointwise", prog.domain, prog.reduced, [Store(st.target, swap(st.expr)) for st in full_dep])
    for p in (stats, apply):
        _collect_loads(p)
    return [stats, apply]


def _peel_first_reductions(prog: Program) -> list[Program]:
    """Two programs: the reductions whose arguments hold none (a softmax's max), each
    stored to a temporary, one value per row or column; then the whole program with those
    read back from the temporaries (its chained reductions now one level shallower)."""
    stored, swap = _read_back(prog, [r for r in reductions_in_order(prog) if not has_reduce(r.arg)])
    rest = [replace(st, expr=swap(st.expr)) for st in prog.stores]
    programs = [Program("rows", prog.domain, prog.reduced, stored), Program("rows", prog.domain, prog.reduced, rest)]
    for p in programs:
        _collect_loads(p)
    return programs


def _read_back(prog: Program, reductions: list):
    """Stores of ``reductions`` into temporaries (one value per row or column), and
    ``swap(expr)``: the expression with each of them read back from its temporary."""
    keep = tuple(1 if d in prog.reduced else s for d, s in enumerate(prog.domain))
    temps: dict[int, Load] = {}
    stored = []
    for i, e in enumerate(reductions):
        tmp = Value(f"_{e.op}{i}", keep, e.dtype)
        temps[id(e)] = Load(tmp, row=True)
        stored.append(Store(tmp, e, is_row=True))
    return stored, _substitution(temps, "reductions are read back")


def _substitution(table: dict, where: str, dims: dict[int, int] | None = None, steps: dict[int, int] | None = None):
    """``swap(expr)``: the expression with each subexpression whose id is in ``table``
    replaced by its entry (shared subexpressions stay shared); ``dims``: a select's dim
    renumbered so (a program over another domain, ``unmerged``), and ``steps``: its bounds
    counted in steps of that many elements of its old dim (each a whole number of them)."""
    memo: dict[int, object] = {}

    def swap(e):
        if _is_number(e):
            return e
        if id(e) not in memo:
            if id(e) in table:
                memo[id(e)] = table[id(e)]
            elif isinstance(e, Load):
                memo[id(e)] = e
            elif isinstance(e, Reduce):
                memo[id(e)] = replace(e, arg=swap(e.arg))
            elif isinstance(e, Op):
                memo[id(e)] = Op(e.op, tuple(swap(a) for a in e.args), e.dtype)
            elif isinstance(e, Select) and dims is not None:
                step = (steps or {}).get(e.dim, 1)
                if any(b % step for b in e.bounds):
                    raise Unsupported(f"a cat piece across steps of {step} elements where {where}")
                memo[id(e)] = replace(e, pieces=tuple(swap(p) for p in e.pieces), dim=dims[e.dim],
                                      bounds=tuple(b // step for b in e.bounds))
            else:
                raise Unsupported(f"a {type(e).__name__.lower()} where {where}")
        return memo[id(e)]

    return swap


def transpose_first(prog: Program, loads: list) -> tuple[list[Program], list[Value]]:
    """A row reduction whose ``loads`` are contiguous across its rows (x + y.t() reduced
    along x's rows) as two programs: a pointwise copy of each such load into a temporary
    over the domain (``geometry.NeedsTranspose`` says in which dim order: the rows'), which
    a kernel stages through shared memory, then the reduction reading the temporaries in
    vectors. It costs a write and a read of each; a row kernel reading such an operand
    element by element ran at a third of that speed. Also returns the temporaries."""
    temps: dict[int, Load] = {}
    stores = []
    for i, ld in enumerate(loads):
        tmp = Value(f"_t{i}", tuple(prog.domain), ld.source.dtype)
        temps[id(ld)] = Load(tmp)
        stores.append(Store(tmp, ld))
    swap = _substitution(temps, "operands are transposed first")
    programs = [Program("pointwise", prog.domain, (), stores),
                Program(prog.family, prog.domain, prog.reduced, [replace(st, expr=swap(st.expr)) for st in prog.stores])]
    for p in programs:
        _collect_loads(p)
    return programs, [t.source for t in temps.values()]


def reduce_in_stages(prog: Program, inner: tuple) -> tuple[list[Program], list[Value]]:
    """A row program whose reduced dims are runs apart in memory (``geometry.NeedsStages``;
    none of its reductions inside another's argument, no full-domain store reading one)
    as two row programs: the first reduces each reduction's argument over the ``inner``
    dims into fp32 partials (its full-domain stores ride along), one per position of
    the other dims; the second reduces the partials over the other reduced dims and
    stores the program's row values from them. sum, prod, amax and amin reduce their
    partials the same way; every partial covers as many elements, so a mean is the mean
    of the partial means, and a variance, from each partial's mean m_i and variance v_i
    (correction 0), is (mean(v_i) + var(m_i)) * count / (count - correction), Chan's
    merge of equal parts. Also returns the partials' values."""
    outer = tuple(d for d in prog.reduced if d not in inner)
    keep = tuple(1 if d in inner else s for d, s in enumerate(prog.domain))
    count = _numel(prog.domain[d] for d in prog.reduced)
    partial_stores, combined, temps, made = [], {}, [], {}

    def partial(op: str, arg) -> Load:
        """The partials of ``op`` over ``arg`` (once: var_mean's halves share the mean's)."""
        if (op, id(arg)) not in made:
            tmp = Value(f"_p{len(temps)}", keep, _F32)
            temps.append(tmp)
            partial_stores.append(Store(tmp, Reduce(op, arg, _F32), is_row=True))
            made[op, id(arg)] = Load(tmp)
        return made[op, id(arg)]

    for e in reductions_in_order(prog):
        if e.op == "var":
            m, v = partial("mean", e.arg), partial("var", e.arg)
            spread = Op("add", (Reduce("mean", v, _F32), Reduce("var", m, _F32)), _F32)
            r = Op("mul", (spread, count / (count - e.correction) if count > e.correction else math.nan), _F32)
        elif e.op in ("sum", "prod", "amax", "amin", "mean"):
            r = Reduce(e.op, partial(e.op, e.arg), _F32)
        else:
            raise Unsupported(f"{e.op} in stages")
        combined[id(e)] = r if e.dtype == _F32 else Op("convert_element_type", (r,), e.dtype)
    swap = _substitution(combined, "reductions run in stages")
    first = Program("rows", prog.domain, inner, [st for st in prog.stores if not st.is_row] + partial_stores)
    second = Program("rows", keep, outer, [replace(st, expr=swap(st.expr)) for st in prog.stores if st.is_row])
    for p in (first, second):
        _collect_loads(p)
    return [first, second], temps


def softmax_sums(reductions) -> list:
    """The sums of ``exp(X - C)`` among ``reductions`` whose ``C`` is a row value computed
    from ``amax(X)`` alone (``C`` is the max itself, or log_softmax's
    ``where(|max| == inf, 0, max)``): ``[(the sum, the amax, X, C)]``. A row too long for
    registers takes such a max and sum in one pass over it (online softmax), where two
    passes would read the row twice: ``sum(exp(X - C)) == exp(max - C) * sum(exp(X - max))``."""
    found = []
    for s in reductions:
        if s.op != "sum" or not (isinstance(s.arg, Op) and s.arg.op == "exp" and s.arg.dtype == _F32):
            continue
        sub = s.arg.args[0]  # exp and the subtraction in fp32, as the online pass computes them
        if not (isinstance(sub, Op) and sub.op == "sub" and sub.dtype == _F32) or any(_is_number(a) for a in sub.args):
            continue
        x, c = sub.args
        maxes = {id(r): r for r in subexpressions([c]) if isinstance(r, Reduce)}
        if len(maxes) != 1 or has_reduce(x) or not is_row(c):
            continue
        (m,) = maxes.values()
        if m.op == "amax" and m.arg is x and m.dtype == _F32:
            found.append((s, m, x, c))
    return found


ONE_PASS_OPS = ("sum", "amax", "amin", "prod")  # reductions a looped row takes beside others in one pass


def first_pass(order) -> tuple:
    """What a row too long for registers reduces in its first walk of the row, where that is
    more than one reduction: ``(softmax, plain)``, the first of ``softmax_sums(order)`` (its
    max and sum taken online) or None, and the other reductions of ``ONE_PASS_OPS`` whose
    arguments read no reduction (a cross-entropy's target logit and weighted sum beside its
    logsumexp). ``(None, [])`` where one reduction or none would be taken."""
    pairs = softmax_sums(order)
    softmax = pairs[0] if pairs else None
    plain = [e for e in order if e.op in ONE_PASS_OPS and not has_reduce(e.arg) and (softmax is None or e is not softmax[1])]
    if (softmax is not None and plain) or len(plain) >= 2:
        return softmax, plain
    return None, []


def reads_rows_once(prog: Program) -> bool:
    """A row reduction too long for registers reads its row once: it stores only row values
    and its reductions are one pass (one sum, max, min or mean; a softmax's max and sum,
    taken online, ``softmax_sums``; or any of these whose arguments read no reduction,
    together: ``first_pass``); anything more re-reads the row."""
    if any(not st.is_row for st in prog.stores):
        return False
    order = reductions_in_order(prog)
    if len(order) == 1:
        return order[0].op != "var"
    if len(order) == 2 and any(s is order[1] and m is order[0] for s, m, _, _ in softmax_sums(order)):
        return True
    softmax, plain = first_pass(order)
    taken = {id(e) for e in plain} | ({id(softmax[0]), id(softmax[1])} if softmax else set())
    return bool(taken) and all(id(e) in taken for e in order)


def _pointwise(op: str, args: tuple, dtype):
    """The expression of pointwise ``op`` over ``args``; a ``where`` of a constant condition
    (a full) is the one branch it picks, converted to ``dtype``."""
    if op == "where" and _is_number(args[0]):
        e = args[1] if args[0] else args[2]
        return e if _is_number(e) or dtype_of(e) == dtype else Op("convert_element_type", (e,), dtype)
    return Op(op, args, dtype)


def _of_loads(e) -> bool:
    """Is ``e`` a load, or an op of loads and numbers (no cat/pad select, no reduction)?"""
    if isinstance(e, Load):
        return True
    return isinstance(e, Op) and all(_is_number(a) or _of_loads(a) for a in e.args)


def has_reduce(e) -> bool:
    return any(isinstance(x, Reduce) for x in subexpressions([e]))


def _collect_loads(prog: Program) -> None:
    prog.loads = [e for e in subexpressions(st.expr for st in prog.stores) if isinstance(e, Load)]


class _Lowering:
    def __init__(self, seg: Segment, iotas: Iotas):
        self.seg = seg
        self.iota_operands = iotas.operands
        self.env: dict[int, object] = {}
        self.writes: set[int] = set()
        self.store_writes: list[Store] = []
        self.write_targets: dict[int, Value] = {}  # a write's result -> the tensor it wrote
        self._leaves: dict[int, Load] = {}
        # shapes of one value per row (a running statistic beside a reduction's result)
        self.row_shapes: set = set()
        if seg.kind in ("reduction", "normalization") and seg.reduced:
            dom, red = tuple(seg.domain), set(seg.reduced)
            keep = tuple(1 if d in red else s for d, s in enumerate(dom))
            self.row_shapes = {keep, tuple(s for d, s in enumerate(dom) if d not in red)} - {dom}

    def value(self, v):
        if not isinstance(v, Value):
            if not _is_number(v):
                raise Unsupported(f"a {type(v).__name__} constant")
            return v
        if id(v) in self.env:
            return self.env[id(v)]
        if not v.is_tensor:
            raise Unsupported(f"{v.name} is a number known only at run time")
        v = self.iota_operands.get(id(v), v)
        leaf = self._leaves.get(id(v))
        if leaf is None:
            leaf = self._leaves[id(v)] = Load(v, row=tuple(v.shape) in self.row_shapes)
        return leaf

    def operand(self, v):
        """``value(v)`` as an operand of a computation (not a view or a store)."""
        e = self.value(v)
        if isinstance(e, Reshaped):
            raise Unsupported(f"{v.name}, a reshape that merges a cat/pad dim, is computed with")
        return e

    def pointwise_before_merge(self, node: Node) -> Reshaped | None:
        """A pointwise op over a reshape that merges a cat/pad dim (``Reshaped``), computed
        over the shape before the reshape and stored through it as the cat/pad itself: a
        reshape only renumbers the elements, and an elementwise op commutes with that, when
        every other operand is a number, a 0-d tensor (broadcast to that shape instead), a
        reshape alike (same shapes before and after), or a tensor read through the inverse
        reshape. None when no operand is such a reshape."""
        out = node.outputs[0]
        args = node.args[:1] if node.op == "convert_element_type" else node.args
        values = [self.value(a) for a in args]
        shapes = {v.shape for v in values if isinstance(v, Reshaped)}
        if not shapes:
            return None
        merged = next(a for a, v in zip(args, values) if isinstance(v, Reshaped))
        if len(shapes) > 1:
            raise Unsupported(f"{node.op} of reshapes that merge cat/pad dims of different shapes")
        (shape,) = shapes
        inner = []
        for a, v in zip(args, values):
            if isinstance(v, Reshaped):
                if tuple(a.shape) != tuple(out.shape):
                    raise Unsupported(f"{a.name}, a reshape that merges a cat/pad dim, broadcast by {node.op}")
                inner.append(v.expr)
            elif _is_number(v) or (isinstance(a, Value) and a.is_tensor and a.ndim == 0):
                inner.append(self.broadcast_scalar(a, out, shape))
            elif tuple(a.shape) == tuple(out.shape) and _of_loads(v):
                # a tensor of the result's shape, or an op of such (a bias broadcast over the
                # rows, cast): read through the inverse reshape, a view its tensors' strides
                # allow or the first call's geometry refuses (then the reference backend runs it)
                inner.append(self.view(v, Node("reshape", (a, shape), {}, (Value(f"{a.name}_m", shape, a.dtype),))))
            else:
                raise Unsupported(f"{merged.name}, a reshape that merges a cat/pad dim, is computed with "
                                  f"{getattr(a, 'name', a)} by {node.op}")
        return Reshaped(_pointwise(node.op, tuple(inner), out.dtype), shape)

    def broadcast_scalar(self, a, out: Value, shape: tuple | None = None):
        """``operand(a)``; a 0-d tensor beside operands of ``out``'s shape (prims take it as a
        number, with no broadcast) is broadcast to that shape (or ``shape``) first, so that
        the views pushed through the op later apply to its load as to the others'."""
        e = self.operand(a)
        shape = tuple(out.shape) if shape is None else shape
        if isinstance(a, Value) and a.is_tensor and a.ndim == 0 and len(shape) > 0 and not _is_number(e):
            e = self.view(e, Node("broadcast_in_dim", (a, shape, ()), {}, (Value(f"{a.name}_b", shape, a.dtype),)))
        return e

    def node(self, node: Node) -> None:
        op = node.op
        out = node.outputs[0]
        if op in METADATA:
            self.env[id(out)] = self.view(self.value(node.args[0]), node)
        elif op in _SUPPORTED_POINTWISE:
            if any(isinstance(a, (tuple, list)) for a in node.args):
                raise Unsupported(f"{op} with sequence arguments")
            if (before_merge := self.pointwise_before_merge(node)) is not None:
                self.env[id(out)] = before_merge
                return
            # convert_element_type's second argument is the dtype: the node's output says it
            args = tuple(self.broadcast_scalar(a, out) for a in (node.args[:1] if op == "convert_element_type" else node.args))
            if all(map(_is_number, args)):
                self.env[id(out)] = number_op(node, args)
            else:
                self.env[id(out)] = _pointwise(op, args, out.dtype)
        elif op == "full" and (fill := fill_number(node)) is not None:
            self.env[id(out)] = fill
        elif op in REDUCTION and seg_kind(node) == "view" and op != "var_mean":
            self.squeeze(node)
        elif op in REDUCTION:
            self.reduction(node)
        elif op in ("cat", "pad"):
            self.resize(node)
        elif op in ("copy_to_out_", "copy_"):
            self.write(node.args[0], node.written, out)
        else:
            raise Unsupported(f"no kernel template for {op}")

    def write(self, src, dst: Value, out: Value) -> None:
        """Store ``src`` into ``dst``; ``out`` is the written tensor afterwards. A ``dst``
        that an earlier write of this segment produced (``x.copy_(a)`` then ``x.add_(1)``
        writes into the first one's result) is that write's tensor: the later store,
        which covers it all, replaces the earlier one (the earlier value stays readable
        as an expression)."""
        e = self.operand(src)
        target = self.write_targets.get(id(dst))
        if target is not None:
            self.store_writes = [st for st in self.store_writes if st.target is not target]
            dst = target
        elif not any(v is dst for v in self.seg.inputs):
            raise Unsupported(f"an in-place write into {dst.name}, which this segment computes (no tensor holds it)")
        self.store_writes.append(Store(dst, e, is_row=is_row(e), across=is_column(e)))
        self.env[id(out)] = e
        self.writes.add(id(out))
        self.write_targets[id(out)] = dst

    def reduction(self, node: Node) -> None:
        if self.seg.kind not in ("reduction", "normalization"):
            raise Unsupported(f"{node.op} outside a row kernel")
        if node.op not in _SUPPORTED_REDUCTIONS:
            raise Unsupported(f"no row kernel for {node.op}")
        dims = tuple(sorted(node.args[1]))
        across = bool(self.seg.across) and dims == tuple(self.seg.across)
        if tuple(node.args[0].shape) != tuple(self.seg.domain) or (dims != tuple(self.seg.reduced) and not across):
            raise Unsupported(f"{node.op} over {dims} of {tuple(node.args[0].shape)} is not the segment's row")
        arg = self.operand(node.args[0])
        if not _exact_in_fp32(arg, _numel(tuple(self.seg.domain[d] for d in dims))):
            raise Unsupported(f"{node.op} of {node.args[0].name}, {node.args[0].dtype}: the reduction kernels "
                              "accumulate in fp32")
        if across:
            if has_reduce(arg):
                raise Unsupported(f"{node.op} per column of a value computed from a row reduction")
            self.env[id(node.outputs[0])] = Reduce(node.op, arg, node.outputs[0].dtype, across=True)
            return
        corr = float(node.kwargs.get("correction", 0) or 0)
        if node.op == "var_mean":
            self.env[id(node.outputs[0])] = Reduce("var", arg, node.outputs[0].dtype, corr)
            self.env[id(node.outputs[1])] = Reduce("mean", arg, node.outputs[1].dtype, corr)
        else:
            self.env[id(node.outputs[0])] = Reduce(node.op, arg, node.outputs[0].dtype, corr)

    def squeeze(self, node: Node) -> None:
        """A reduction over size-1 dims only (the segmenter's ``view``): sum, amax, amin and
        prod of one element are that element, so it is a reshape (var is not)."""
        out = node.output
        if node.op == "var":
            raise Unsupported("var over size-1 dims")
        e = self.view(self.operand(node.args[0]), Node("reshape", (node.args[0], tuple(out.shape)), {}, node.outputs))
        self.env[id(out)] = e if dtype_of(e) == out.dtype else Op("convert_element_type", (e,), out.dtype)

    def view(self, e, node: Node):
        """``node`` (a view or slice) applied to expression ``e``: pushed to its loads."""
        if _is_number(e) or node.op == "stride_order":  # the same values: layout is the store's
            return e
            return e
        if isinstance(e, Load):
            if e.shifts:
                raise Unsupported(f"{node.op} of a cat/pad piece")
            shape = tuple(node.outputs[0].shape)
            # one value per row: a row's view that keeps that shape, or a reshape of a whole
            # input to it (targets [b, s] viewed as [b * s] beside logits [b * s, vocab])
            whole = node.op == "reshape" and _numel(e.source.shape) == _numel(shape)
            row = shape in self.row_shapes and (e.row or whole)
            return Load(e.source, e.views + (node,), row=row)
        if (is_row(e) or is_column(e)) and has_reduce(e):
            # one number per row (column): any view that keeps the rows in their order (reshape,
            # squeeze, broadcast_in_dim without reordering dims, each extent onto a kept dim)
            # is the same value; a transpose of kept dims (or a slice) is not, nor a broadcast
            # along the rows (of a square domain: its reduced shape is a column's too)
            bdims = node.args[2] if node.op == "broadcast_in_dim" else ()
            if node.op in ("reshape", "squeeze", "shallow_copy") or (
                node.op == "broadcast_in_dim" and list(bdims) == sorted(bdims) and self.keeps_rows(node, is_row(e))
            ):
                return e
            raise Unsupported(f"{node.op} of a reduction result")
        # an op over inputs of a row's shape, without a reduction (a weight's cast has that
        # shape too where the domain is square): pushed to its loads like any op, whose
        # views then say whether each is one value per row
        if isinstance(e, Op):
            args = tuple(self.view(a, node) for a in e.args)
            if any(isinstance(a, Reshaped) for a in args):
                # a reshape merging a cat/pad dim of one operand: the op is computed over the
                # shape before the reshape and only stored through it, like the cat/pad itself
                return Reshaped(e, tuple(node.args[0].shape))
            return Op(e.op, args, e.dtype)
        if isinstance(e, Reshaped) and node.op == "reshape":
            return e
        if isinstance(e, Select) and node.op == "reshape":
            before, after = tuple(node.args[0].shape), tuple(node.outputs[0].shape)
            new = _dim_through_reshape(before, after, e.dim)
            return Reshaped(e, before) if new is None else self.reshape_select(e, new, after)
        if isinstance(e, Select) and node.op in ("transpose", "broadcast_in_dim"):
            return self.view_select(e, node)
        if isinstance(e, Select) and node.op == "slice_prim":
            return self.slice_select(e, node)
        raise Unsupported(f"{node.op} of a {type(e).__name__.lower()} result")

    def view_select(self, e: Select, node: Node) -> Select:
        """A transpose or broadcast_in_dim of a cat/pad result (litgpt's RoPE cat read by the
        grouped-query expand; a gradient's pad transposed back to ``[b, s, h, e]``): the same
        selects along the dims their dims become, each piece viewed alike with its own extents
        along the select dims, its loads' shifts moved with their dims."""
        in_shape = tuple(node.args[0].shape)
        if node.op == "transpose":
            perm = tuple(node.args[1])
            to = {p: j for j, p in enumerate(perm)}

            def view_args(piece):
                return (perm,)
        else:
            shape, bdims = tuple(node.args[1]), tuple(node.args[2])
            to = dict(enumerate(bdims))

            def view_args(piece):
                out = list(shape)
                for i, b in enumerate(bdims):
                    if in_shape[i] == shape[b]:  # a kept extent (an expanded one is 1 in every piece)
                        out[b] = piece[i]
                return (tuple(out), bdims)

        def move(x, extents: dict):
            if _is_number(x):
                return x
            if isinstance(x, Op):
                return Op(x.op, tuple(move(a, extents) for a in x.args), x.dtype)
            if isinstance(x, Select):
                if node.op == "broadcast_in_dim" and in_shape[x.dim] != shape[bdims[x.dim]]:
                    raise Unsupported("a broadcast along a cat/pad dim")
                pieces = tuple(move(p, {**extents, x.dim: hi - lo}) for p, lo, hi in zip(x.pieces, x.bounds, x.bounds[1:]))
                return Select(pieces, x.bounds, x.fill, x.dtype, to[x.dim])
            if isinstance(x, Load) and not x.row:
                piece = tuple(extents.get(d, s) for d, s in enumerate(in_shape))
                args = view_args(piece)
                src = Value(f"{x.source.name}_piece", piece, x.source.dtype)
                out_shape = tuple(piece[p] for p in args[0]) if node.op == "transpose" else args[0]
                out = Value(f"{x.source.name}_piece", out_shape, x.source.dtype)
                return Load(x.source, x.views + (Node(node.op, (src,) + args, {}, (out,)),),
                            tuple(sorted((to[d], at) for d, at in x.shifts)), x.row)
            raise Unsupported(f"{node.op} of a cat/pad piece holding a {type(x).__name__.lower()}")

        return move(e, {})

    def slice_select(self, e: Select, node: Node) -> Select:
        """A slice of a cat/pad result (a model's labels padded with an ignored index, then
        shifted by one: ``F.pad(labels, (0, 1), value=-100)[..., 1:]``): along the select dim
        the bounds move by the slice's start and each piece still inside reads its loads
        sliced to the part it keeps; along other dims every load is sliced alike."""
        src, start, end = node.args[0], list(node.args[1]), list(node.args[2])
        steps = node.args[3] if len(node.args) > 3 and node.args[3] is not None else [1] * len(start)
        if any(st != 1 for st in steps):
            raise Unsupported("a strided slice of a cat/pad result")
        d = e.dim
        lo_s, hi_s = start[d], end[d]

        def sliced(x, piece_lo: int, piece_hi: int, keep_lo: int, keep_hi: int):
            """``x`` (a piece over ``[piece_lo, piece_hi)`` of dim d) cut to ``[keep_lo,
            keep_hi)`` of that dim, and every other dim to the slice."""
            if _is_number(x):
                return x
            if isinstance(x, Op):
                return Op(x.op, tuple(sliced(a, piece_lo, piece_hi, keep_lo, keep_hi) for a in x.args), x.dtype)
            if isinstance(x, Load) and not x.row and all(dim == d and at == piece_lo for dim, at in x.shifts):
                shape = list(src.shape)
                shape[d] = piece_hi - piece_lo
                a, b = list(start), list(end)
                a[d], b[d] = keep_lo - piece_lo, keep_hi - piece_lo
                before = Value(f"{x.source.name}_piece", tuple(shape), x.source.dtype)
                out = Value(f"{x.source.name}_slice", tuple(hi - lo for lo, hi in zip(a, b)), x.source.dtype)
                view = Node("slice_prim", (before, tuple(a), tuple(b), tuple(steps)), {}, (out,))
                return Load(x.source, x.views + (view,), ((d, keep_lo - lo_s),) if x.shifts else (), x.row)
            raise Unsupported(f"a slice of a cat/pad piece holding a {type(x).__name__.lower()}")

        pieces, bounds = [], [0]
        for p, lo, hi in zip(e.pieces, e.bounds, e.bounds[1:]):
            keep_lo, keep_hi = max(lo, lo_s), min(hi, hi_s)
            if keep_lo >= keep_hi:
                continue
            if len(pieces) and bounds[-1] != keep_lo - lo_s:
                raise Unsupported("a slice of a cat/pad keeping pieces that do not touch")
            if not pieces:
                bounds = [keep_lo - lo_s]
            pieces.append(sliced(p, lo, hi, keep_lo, keep_hi))
            bounds.append(keep_hi - lo_s)
        if not pieces:
            return e.fill
        return Select(tuple(pieces), tuple(bounds), e.fill, e.dtype, d)

    def keeps_rows(self, node: Node, rows: bool) -> bool:
        """Does broadcast_in_dim ``node`` put each extent of its input onto a kept dim: the
        rows' (``rows``), or the columns' of the sums per column?"""
        reduced = set(self.seg.reduced if rows else self.seg.across)
        shape, bdims = node.args[0].shape, node.args[2]
        return all(d not in reduced for s, d in zip(shape, bdims) if s != 1)

    def reshape_select(self, e: Select, new: int, after: tuple) -> Select:
        """A reshape to ``after`` of a cat/pad result that keeps its dim whole, as dim ``new``
        (merging or splitting only the dims on either side, as a linear layer's backward does
        to a cat of q, k and v gradients): the same select along the new dim, each piece
        reshaped alike with its own extent there, its loads' shifts moved to the new dim."""
        d = e.dim

        def move(x, extent):
            if _is_number(x):
                return x
            if isinstance(x, Op):
                return Op(x.op, tuple(move(a, extent) for a in x.args), x.dtype)
            if isinstance(x, Select) and x.dim == d:
                pieces = tuple(move(p, hi - lo) for p, lo, hi in zip(x.pieces, x.bounds, x.bounds[1:]))
                return Select(pieces, x.bounds, x.fill, x.dtype, new)
            if isinstance(x, Load) and all(dim == d for dim, _ in x.shifts):
                shape = after[:new] + (extent,) + after[new + 1:]
                out = Value(f"{x.source.name}_piece", shape, x.source.dtype)
                last = x.views[-1].outputs[0] if x.views else x.source  # the piece as viewed so far
                return Load(x.source, x.views + (Node("reshape", (last, shape), {}, (out,)),),
                            tuple((new, at) for _, at in x.shifts), x.row)
            raise Unsupported(f"a reshape of a cat/pad along dim {d} whose pieces are cut along another dim")

        return move(e, None)

    def resize(self, node: Node) -> None:
        if self.seg.kind != "resize":
            raise Unsupported(f"{node.op} outside a resize segment")
        out = node.outputs[0]
        if node.op == "cat":
            tensors, dim = node.args
            d = dim % out.ndim
            bounds, pieces, at = [0], [], 0
            tensors = [t for t in tensors if t.shape[d]]  # an empty piece (litgpt's RoPE over the whole head:
            #                                                q[..., n:]) adds nothing
            if len(tensors) == 1:  # what is left is the cat
                self.env[id(out)] = self.operand(tensors[0])
                return
            for t in tensors:
                pieces.append(self.shifted(self.operand(t), at, node, d))
                at += t.shape[d]
                bounds.append(at)
            self.env[id(out)] = Select(tuple(pieces), tuple(bounds), 0, out.dtype, d)
        else:
            a, fill, config = node.args
            if not _numel(a.shape):  # a pad of nothing (a gradient of an empty slice) is its fill
                if isinstance(fill, Value):
                    raise Unsupported("a pad of nothing with a fill known only at run time")
                self.env[id(out)] = typed_number(fill, out.dtype)
                return
            if any(interior for _, _, interior in config):
                raise Unsupported("interior padding")
            if any(lo < 0 or hi < 0 for lo, hi, _ in config):
                raise Unsupported("negative padding")
            padded = [d for d, (lo, hi, _) in enumerate(config) if lo or hi] or [out.ndim - 1]
            e = self.operand(a)
            for d in padded:
                e = self.shifted(e, config[d][0], node, d)
            for d in padded:  # one select per padded dim: fill outside the input's extent there
                lo = config[d][0]
                e = Select((e,), (lo, lo + a.shape[d]), fill, out.dtype, d)
            self.env[id(out)] = e

    def shifted(self, e, at: int, node: Node, dim: int):
        """``e`` read ``at`` elements further along domain dim ``dim`` (a piece of ``node``)."""
        if _is_number(e):
            return e
        if isinstance(e, Load):
            shifts = dict(e.shifts)
            shifts[dim] = shifts.get(dim, 0) + at
            return Load(e.source, e.views, tuple(sorted(shifts.items())), e.row)
        if isinstance(e, Op):
            return Op(e.op, tuple(self.shifted(a, at, node, dim) for a in e.args), e.dtype)
        if isinstance(e, Select):
            bounds = tuple(b + at for b in e.bounds) if e.dim == dim else e.bounds
            return Select(tuple(self.shifted(p, at, node, dim) for p in e.pieces), bounds, e.fill, e.dtype, e.dim)
        raise Unsupported(f"{node.op} of a {type(e).__name__.lower()} result")


def _dim_through_reshape(before: tuple, after: tuple, d: int) -> int | None:
    """The dim of ``after`` that dim ``d`` of ``before`` is, whole: the same extent, the
    same number of elements before it and after it; None if the reshape cuts into it."""
    outer = _numel(before[:d])
    for j in range(len(after)):
        if after[j] == before[d] and _numel(after[:j]) == outer:
            return j
    return None


def dtype_of(e):
    if isinstance(e, Load):
        return e.source.dtype
    if _is_number(e):
        return type(e)
    return e.dtype


def render(e, load_name=None, typed: bool = False) -> str:
    """A readable form of an expression. With ``load_name`` (a function of the load) and
    ``typed`` it is the compile key's program text: names erased, dtypes and constants kept."""
    if _is_number(e):
        return repr(e)
    if isinstance(e, Load):
        if load_name is not None:
            return load_name(e)
        views = "".join(f".{n.op}" for n in e.views)
        return f"{e.source.name}{views}" + "".join(f"<<{at}@{d}" for d, at in e.shifts)
    args = ", ".join(render(a, load_name, typed) for a in children(e))
    if isinstance(e, Op):
        head = e.op
    elif isinstance(e, Reduce):
        head = f"{e.op}[{'column' if e.across else 'row'}]" + (f":{e.correction}" if typed else "")
    else:
        head = f"select{e.bounds}" + (f"@{e.dim}:{e.fill}" if typed else "")
    return f"{head}{':' + str(e.dtype) if typed else ''}({args})"
