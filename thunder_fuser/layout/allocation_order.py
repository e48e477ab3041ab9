"""Allocation-order inference: every value's memory order, from the inputs it depends on.

An elementwise op's output is laid out as torch lays it out (TensorIterator's rule): its
operands are read in argument order, and for each pair of dims the first operand whose
strides order them (neither broadcast nor of size one) decides; a pair none orders keeps
logical order. So a channels-last ``x`` times a contiguous ``y`` is channels-last, and
``y * x`` contiguous, as in eager; a reduction's result is contiguous, as torch allocates
it; a view keeps its operand's order; ``cat`` and ``pad`` are contiguous unless all their
operands are channels-last (torch's suggested memory format). What is left follows a reference
input (NVIDIA/Fuser#1756): the input with the most non-broadcast dims;
if inputs of that rank disagree, keep logical order. The output's dims that trace back to
reference dims are ordered as the reference orders them; dims that trace to nothing
(new broadcast dims) go outermost in logical order. Tracing goes through pointwise ops,
broadcast, permute, squeeze, reductions (kept dims keep their order) and reshapes that
split or merge dims cleanly.

Orders list dims from outermost to innermost, like ``x.permute(order).is_contiguous()``.
"""

from __future__ import annotations

import torch
from torch._prims_common import are_strides_like_channels_last_or_false

from thunder_fuser.ir.ops import kind_of
from thunder_fuser.ir.region import Node, Region, Value
from thunder_fuser.ir.torch_impls import REFERENCE_IMPLS, strides_for_order
from thunder_fuser.ir.reshape_groups import reshape_groups

# An atom says: this dim is (part ``part`` of ``nparts`` of) dim ``dim`` of region input ``inp``.
Atom = tuple[str, int, int, int]
Prov = tuple[frozenset, ...]  # per value dim: the atoms it traces back to


def stride_order(shape, strides) -> tuple[int, ...]:
    """Outermost-to-innermost dims of a strided tensor; ties (size-1 or stride-0 dims) keep
    logical order, so a contiguous tensor gives ``(0, 1, ..., n-1)``."""
    n = len(shape)
    return tuple(sorted(range(n), key=lambda d: (-strides[d] if shape[d] != 1 else 0, d if shape[d] != 1 else -1)))


def _node_dim_map(node: Node, operand: Value) -> list[list[tuple[int, int, int]]]:
    """For each output dim of ``node``: the operand dims it reads, as (dim, part, nparts)."""
    out = node.outputs[0]
    op = node.op
    kind = kind_of(op)
    if kind == "pointwise" or op in ("shallow_copy", "stride_order", "copy_", "copy_to_out_"):
        if operand.ndim != out.ndim:
            return [[] for _ in range(out.ndim)]
        return [[] if d in operand.broadcast_dims else [(d, 0, 1)] for d in range(out.ndim)]
    if op == "broadcast_in_dim":
        m = [[] for _ in range(out.ndim)]
        for src, dst in enumerate(node.args[2]):
            if operand.shape[src] == out.shape[dst] and src not in operand.broadcast_dims:
                m[dst] = [(src, 0, 1)]
        return m
    if op == "transpose":
        return [[(p, 0, 1)] for p in node.args[1]]
    if op == "squeeze":
        dims = {d % max(operand.ndim, 1) for d in node.args[1]}
        kept = [d for d in range(operand.ndim) if d not in dims]
        return [[(d, 0, 1)] for d in kept]
    if kind == "reduction":
        dims = {d % max(operand.ndim, 1) for d in node.args[1]}
        kept = [d for d in range(operand.ndim) if d not in dims]
        return [[(d, 0, 1)] for d in kept]
    if op == "reshape":
        m = [[] for _ in range(out.ndim)]
        groups = reshape_groups(operand.shape, out.shape) or []
        for src_dims, dst_dims in groups:
            if len(src_dims) == 1 and len(dst_dims) >= 1:
                for t, j in enumerate(dst_dims):
                    m[j] = [(src_dims[0], t, len(dst_dims))]
            elif len(dst_dims) == 1 and len(src_dims) > 1:
                m[dst_dims[0]] = [(d, 0, 1) for d in src_dims]
        return m
    if op in ("slice_prim", "pad"):
        return [[(d, 0, 1)] for d in range(out.ndim)]
    if op == "cat":
        return [[(d, 0, 1)] for d in range(out.ndim)]
    return [[] for _ in range(out.ndim)]


def dim_provenance(region: Region, input_broadcast: dict[str, frozenset] | None = None) -> dict[int, Prov]:
    """Per value (by id): for each dim, the region-input dims it traces back to. Stride-0
    (broadcast) input dims trace to nothing, so they never steer a layout."""
    input_broadcast = input_broadcast or {}
    prov: dict[int, Prov] = {}
    for v in region.inputs:
        if v.is_tensor:
            bdims = input_broadcast.get(v.name, v.broadcast_dims)
            prov[id(v)] = tuple(
                frozenset() if d in bdims else frozenset({(v.name, d, 0, 1)}) for d in range(v.ndim)
            )
    for node in region.nodes:
        if node.op == "update_aliases":
            for a, o in zip(node.args[0], node.outputs):
                prov[id(o)] = prov.get(id(a), tuple(frozenset() for _ in range(o.ndim)))
            continue
        for oi, out in enumerate(node.outputs):
            if not out.is_tensor:
                continue
            dims: list[set] = [set() for _ in range(out.ndim)]
            operands = node.tensor_inputs()
            if node.op == "copy_to_out_":
                operands = [node.args[0]]
            elif node.op == "copy_":
                operands = [node.args[0]]
            for operand in operands:
                src = prov.get(id(operand))
                if src is None:
                    continue
                for j, reads in enumerate(_node_dim_map(node, operand)):
                    for d, part, nparts in reads:
                        for inp, idim, p0, n0 in src[d]:
                            dims[j].add((inp, idim, p0 * nparts + part, n0 * nparts))
            prov[id(out)] = tuple(frozenset(s) for s in dims)
    return prov


def _non_broadcast_dims(v: Value, broadcast: dict[str, frozenset]) -> int:
    bdims = broadcast.get(v.name, v.broadcast_dims)
    return sum(1 for d in range(v.ndim) if v.shape[d] != 1 and d not in bdims)


def _order_from_reference(out: Value, out_prov: Prov, ref: Value, ref_order: tuple[int, ...]) -> tuple[int, ...]:
    rank = {d: r for r, d in enumerate(reversed(ref_order))}  # 0 = innermost reference dim
    mapped: list[tuple[tuple[int, int], int]] = []
    unmapped: list[int] = []
    for j in range(out.ndim):
        # a split dim's earlier parts are outer: (rank, parts after this one) orders them
        keys = [(rank[idim], nparts - 1 - part) for inp, idim, part, nparts in out_prov[j] if inp == ref.name]
        if keys and out.shape[j] != 1:
            mapped.append((min(keys), j))
        else:
            unmapped.append(j)
    mapped.sort(reverse=True)  # outermost first
    return tuple(unmapped) + tuple(j for _, j in mapped)


def infer_allocation_orders(
    region: Region,
    input_orders: dict[str, tuple[int, ...]],
    input_broadcast: dict[str, frozenset] | None = None,
    prov: dict[int, Prov] | None = None,
    input_strides: dict[str, tuple[int, ...]] | None = None,
) -> dict[int, tuple[int, ...]]:
    """Allocation order (outermost first) for every tensor value in the region.

    ``input_orders``/``input_broadcast`` give each input's stride order and stride-0 dims as
    met at run time; a broadcast operand never becomes the reference. ``input_strides``: the
    inputs' strides themselves, which TensorIterator reads, a size-1 dim's included.
    """
    input_broadcast = input_broadcast or {}
    real = {id(v): input_strides[v.name] for v in region.inputs if input_strides and v.name in input_strides}
    prov = prov if prov is not None else dim_provenance(region, input_broadcast)
    inputs = {v.name: v for v in region.inputs if v.is_tensor}
    result: dict[int, tuple[int, ...]] = {}
    for v in region.inputs:
        if v.is_tensor:
            result[id(v)] = input_orders.get(v.name, tuple(range(v.ndim)))
    zeros: dict[int, frozenset] = {id(v): input_broadcast.get(v.name, v.broadcast_dims) for v in region.inputs}
    producers = region.producers()
    for node in region.nodes:
        operands = node.tensor_inputs()
        if operands:
            z = zero_dims(node, operands, zeros)
            zeros.update((id(o), z) for o in node.outputs if o.is_tensor)
        for out in node.outputs:
            if not out.is_tensor or id(out) in result:
                continue
            if out.laid_out_as is not None and id(out.laid_out_as) in result:  # an elided write's value
                dst = out.laid_out_as
                result[id(out)] = result[id(dst)]
                zeros[id(out)] = zeros.get(id(dst), frozenset())
                if id(dst) in real:
                    real[id(out)] = real[id(dst)]
                continue
            if node.op in ("copy_", "copy_to_out_"):
                dst = node.written
                result[id(out)] = result.get(id(dst), tuple(range(out.ndim)))
                if id(dst) in real:  # the destination itself, written
                    real[id(out)] = real[id(dst)]
                continue
            if node.op == "update_aliases":
                continue
            if node.op == "stride_order":  # the order the program asked for (order[d]: dim d's rank)
                result[id(out)] = tuple(sorted(range(out.ndim), key=lambda d: -node.args[1][d]))
                continue
            if kind_of(node.op) == "reduction" or out.contiguous:  # as torch allocates a reduction's result
                result[id(out)] = tuple(range(out.ndim))
                continue
            if node.op == "convert_element_type" and operands:
                strides = _converted_strides(node, operands[0], result, zeros, real, producers)
                real[id(out)] = strides
                zeros[id(out)] = frozenset(d for d, (s, e) in enumerate(zip(strides, out.shape)) if s == 0 and e != 1)
                result[id(out)] = eager_order(out.shape, [strides])
                continue
            # a 0-d operand (thunder's prims take one beside a tensor with dims) orders nothing
            full = [v for v in operands if v.ndim]
            if (kind_of(node.op) == "pointwise" and full and all(v.ndim == out.ndim and id(v) in result for v in full)):
                # a number or 0-d operand is an operand of another shape to TensorIterator: no fast setup
                scalars = any(isinstance(a, (int, float, complex)) or (isinstance(a, Value) and a.is_tensor and not a.ndim)
                              for a in node.args)
                result[id(out)] = eager_order(out.shape, [_strides(v, result[id(v)], zeros, real) for v in full],
                                              fast=not scalars)
                continue
            if node.op in ("cat", "pad"):  # torch allocates them in its suggested memory format
                result[id(out)] = _suggested_format(out, operands, [result.get(id(v)) for v in operands], real)
                continue
            if node.op in _VIEWS and operands and id(operands[0]) in result:
                # a view keeps its operand's strides (so eager's next op sees them)
                src = operands[0]
                # its strides themselves, as torch views its operand's (an input's own, a computed
                # value's as allocated): TensorIterator reads a size-1 dim's stride too
                viewed = _view_strides(node, src, real.get(id(src)) or strides_for_order(src.shape, result[id(src)]))
                if viewed is COPIED:  # torch's reshape copies what no view can give: a row-major clone
                    result[id(out)] = tuple(range(out.ndim))
                    continue
                if viewed is not None:
                    real[id(out)] = viewed
                through = tuple(frozenset((src.name, d, p, n) for d, p, n in reads)
                                for reads in _node_dim_map(node, src))
                result[id(out)] = _order_from_reference(out, through, src, result[id(src)])
                continue
            result[id(out)] = _infer_one(out, prov[id(out)], inputs, input_orders, input_broadcast)
        if node.op == "update_aliases":
            for a, o in zip(node.args[0], node.outputs):
                result[id(o)] = result.get(id(a), tuple(range(o.ndim)))
                if id(a) in real:
                    real[id(o)] = real[id(a)]
    return result


_VIEWS = ("broadcast_in_dim", "reshape", "transpose", "squeeze", "shallow_copy", "slice_prim")


COPIED = "copied"  # a reshape torch makes by copying (``_view_strides``)


def _view_strides(node: Node, src: Value, strides):
    """The strides of view ``node`` of ``src`` (laid out at ``strides``), as torch views it;
    ``COPIED`` where torch copies (a reshape that merges dims no stride can merge, such as an
    expanded dim: grouped-query attention's keys); None where the op fails on a meta tensor."""
    try:
        base = torch.empty_strided(src.shape, strides, dtype=src.dtype, device="meta")
        v = REFERENCE_IMPLS[node.op](base, *node.args[1:], **node.kwargs)
    except Exception:  # noqa: BLE001 - no meta view: unknown
        return None
    if not isinstance(v, torch.Tensor):
        return None
    if v._is_view():
        return tuple(v.stride())
    return COPIED if node.op == "reshape" else None


def _converted_strides(node: Node, src: Value, result: dict, zeros: dict, real: dict, producers: dict) -> tuple[int, ...]:
    """The strides torch gives conversion ``node`` of ``src``: ``src``'s own, as the kernel of
    the op it feeds reads it, where torch converts as it reads (no tensor of its own, a
    broadcast's zero strides kept); where torch makes it by ``.to()`` (``Value.materialized``),
    ``.to()``'s copy, dense, made before the broadcast thunder put first where torch converts
    first (``Value.converted_first``: the CPU's TensorIterator converts an operand, then
    broadcasts it)."""
    read = _strides(src, result.get(id(src), tuple(range(src.ndim))), zeros, real)
    if not node.outputs[0].materialized:
        return read
    p = producers.get(id(src))
    if node.outputs[0].converted_first and p is not None and p.op == "broadcast_in_dim" and p.tensor_inputs():
        x = p.tensor_inputs()[0]
        copied = _to_copy(x.shape, _strides(x, result.get(id(x), tuple(range(x.ndim))), zeros, real))
        viewed = _view_strides(p, x, copied)
        if viewed not in (None, COPIED):
            return viewed
    return _to_copy(src.shape, read)


def _to_copy(shape, strides) -> tuple[int, ...]:
    """The strides of ``.to()``'s copy of a tensor at ``strides`` (its own where it is dense,
    else dense in their order), as torch computes them."""
    return tuple(_meta(shape, strides).to(torch.float64).stride())


def _meta(shape, strides) -> torch.Tensor:
    """A meta tensor at these strides, for torch's own predicates over a tensor's strides."""
    return torch.empty_strided(shape, strides, device="meta")


def _suggested_format(out: Value, operands: list, operand_orders: list, real: dict) -> tuple[int, ...]:
    """torch's ``suggest_memory_format`` of its operands (``cat``, ``pad``, a CPU ``.to()``):
    channels-last where every operand's is (4-D or 5-D), else contiguous."""
    n = out.ndim
    channels_last = (0, *range(2, n), 1) if n in (4, 5) else None
    if channels_last is not None and operands and all(
        o is not None and _channels_last_strides(v.shape, real.get(id(v)) or strides_for_order(v.shape, o))
        for v, o in zip(operands, operand_orders)
    ):
        return channels_last
    return tuple(range(n))


def _channels_last_strides(shape, strides) -> bool:
    """c10's ``is_channels_last_strides_2d``/``_3d`` (what ``suggest_memory_format`` reads): a
    size-1 dim counts by its stride, so [1, 5, 5, 1] at strides (25, 1, 5, 5) is channels-last,
    which comparing permutations missed (found by the random programs)."""
    return len(shape) in (4, 5) and are_strides_like_channels_last_or_false(tuple(shape), tuple(strides))


def _strides(v: Value, order: tuple[int, ...], zeros: dict[int, frozenset], real: dict) -> tuple[int, ...]:
    """``v``'s strides as TensorIterator reads them: an input's own or a view's as torch
    views its operand (``real``), else laid out in ``order`` (a value an op computes is
    dense, as torch allocates it), 0 where a dim is
    broadcast (stride 0 in an input, a new dim of a broadcast, or read from one through
    views). A size-1 dim keeps its stride: TensorIterator compares it (at batch 1, a
    permuted input's size-1 dims stop the sort from swapping the dims around them)."""
    z = zeros.get(id(v), frozenset())
    strides = real.get(id(v)) or strides_for_order(v.shape, order)
    return tuple(0 if d in z else s for d, s in enumerate(strides))


def zero_dims(node: Node, operands: list[Value], zeros: dict[int, frozenset]) -> frozenset:
    """The broadcast (stride-0) dims of ``node``'s output: for a view, its new dims and those it reads
    only from its operand's broadcast dims; for a conversion, its operand's (thunder's type
    promotion converts a broadcast operand inside the op; ``_converted_strides`` tells where
    torch makes a copy); none for any other computed value (torch allocates it dense)."""
    src = operands[0]
    if node.op == "convert_element_type":
        return zeros.get(id(src), frozenset())
    if node.op not in _VIEWS:
        return frozenset()
    z = zeros.get(id(src), frozenset())
    return frozenset(j for j, reads in enumerate(_node_dim_map(node, src)) if all(d in z for d, _, _ in reads))


def _fast_setup(shape, operand_strides) -> tuple[int, ...] | None:
    """TensorIterator's fast setup (``compute_fast_setup_type``): operands of one shape (none
    broadcast) all contiguous, or all channels-last, give an output laid out so, whatever
    the strides of their size-1 dims (``tanh`` of a [2, 1, 1, 1] input at strides (1, 2, 2, 2)
    is contiguous); None otherwise."""
    n = len(shape)
    if not operand_strides or any(s == 0 and e != 1 for st in operand_strides for s, e in zip(st, shape)):
        return None
    metas = [_meta(shape, st) for st in operand_strides]
    if all(m.is_contiguous() for m in metas):
        return tuple(range(n))
    if n in (4, 5):
        fmt = torch.channels_last if n == 4 else torch.channels_last_3d
        if all(m.is_contiguous(memory_format=fmt) for m in metas):
            return (0, *range(2, n), 1)
    return None


def eager_order(shape, operand_strides: list[tuple[int, ...]], fast: bool = True) -> tuple[int, ...]:
    """The output order (outermost first) torch's TensorIterator gives an elementwise op of
    operands with these strides: an insertion sort of the dims, innermost first, where the
    first operand that orders a pair (both strides non-zero and different, or equal over a
    longer first dim) decides it (``TensorIteratorBase::reorder_dimensions``); ``fast``: no
    operand of another shape (a number), so the fast setup may apply (``_fast_setup``)."""
    n = len(shape)
    same = _fast_setup(shape, operand_strides) if fast else None
    if same is not None:
        return same

    def should_swap(d0: int, d1: int) -> int:
        for strides in operand_strides:
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:  # equal strides: the shorter dim goes innermost
                return 1
        return 0

    perm = list(range(n - 1, -1, -1))  # innermost first
    for i in range(1, n):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            c = should_swap(perm[dim0], perm[dim1])
            if c > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif c < 0:
                break
    return tuple(reversed(perm))


def _infer_one(out: Value, out_prov: Prov, inputs: dict[str, Value], input_orders, input_broadcast) -> tuple[int, ...]:
    logical = tuple(range(out.ndim))
    deps = {inp for atoms in out_prov for inp, *_ in atoms}
    if not deps:
        return logical
    candidates = [inputs[n] for n in sorted(deps) if n in inputs]
    best = max(_non_broadcast_dims(v, input_broadcast) for v in candidates)
    refs = [v for v in candidates if _non_broadcast_dims(v, input_broadcast) == best]
    orders = {
        _order_from_reference(out, out_prov, v, input_orders.get(v.name, tuple(range(v.ndim)))) for v in refs
    }
    if len(orders) != 1:
        return logical
    return orders.pop()
