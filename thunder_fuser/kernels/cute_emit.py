"""CuTe DSL kernels built from a lowered program: the pointwise, row and column families.

CuTe DSL traces Python, so a kernel here is a closure over the program: while CuTe traces
the ``@cute.kernel`` body, plain Python walks the expression tree and emits one vector op
per node (the tree is unrolled at trace time; nothing of it exists at run time). Only the
few helpers that branch or loop on run-time values are ``@cute.jit`` (the DSL rewrites
their ``if`` and ``for``; ``_for_range`` runs a plain-Python body in such a loop), and they
live in this real source file, as CuTe DSL requires.

Operands arrive as ``[outer dims innermost-first..., N]`` (see ``geometry.py``) and are
viewed here as 2-D ``(M, N)`` with a hierarchical first mode, so one linear row index ``m``
addresses any number of outer dims, each with its own stride.

* pointwise: one thread per vector of ``V`` elements along ``N``: 128-bit loads and stores
  for stride-1 operands, one scalar load for stride-0 (broadcast) operands, ``V`` scalar
  loads for any other stride (an input whose fastest dim is not the output's). Without
  outer dims a ragged ``N`` predicates the last vector, element by element. cat/pad picks a
  piece per vector along ``N`` or, along an outer dim (placed outermost), per row.
* rows (reduction, normalization): ``row_threads`` threads hold a whole row in registers
  (``row_vectors`` vectors each), reduce thread -> warp (shuffles) -> block (shared
  memory), and the epilogue reuses the registers: one read and one write per element.
  Several rows share a block when a row needs fewer than 32 threads. A row too long for
  registers (over 8 vectors x 1024 threads) is re-read once per reduction and once for the
  stores, reductions in dependency order.
* columns (reductions whose kept dims are innermost in memory): see ``build_columns``; two
  launches, partials per split of the reduced extent in an fp32 workspace, no atomics.
* split rows (reductions of a few long rows): see ``build_split_rows``; the same two
  launches, each row split across blocks.

Math on fp16/bf16 values runs in fp32 and rounds once per stored value.
"""

from __future__ import annotations

import math
import operator

import torch

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor

from thunder_fuser.kernels.expr import (
    Load, Op, Program, Reduce, Select, Unsupported, column_sums, dtype_of, reductions_in_order, softmax_sums,
    subexpressions,
)
from thunder_fuser.kernels import packed_narrowing
from thunder_fuser.kernels.geometry import (
    COLUMN_THREADS, Geometry, Run, column_state_offsets, mapped_layout, operand_align, ref_first, row_block, stage_tile,
    vector_access, vector_width,
)

DTYPES = {
    torch.float32: cutlass.Float32, torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16,
    torch.float64: cutlass.Float64, torch.bool: cutlass.Boolean, torch.int8: cutlass.Int8,
    torch.uint8: cutlass.Uint8, torch.int16: cutlass.Int16, torch.int32: cutlass.Int32,
    torch.int64: cutlass.Int64,
}
LOW_PRECISION = (torch.float16, torch.bfloat16)
STREAM_UNROLL = 4  # vectors a thread loads per step of a loop along a row (a split row, a row too long
#                   for registers) or down columns, all before it uses any: a step per vector kept one
#                   load in flight
ONLINE_SOFTMAX = True  # rows too long for registers take a softmax's max and sum in one pass
#                        (``expr.softmax_sums``); False only to measure the two passes beside it
CACHE_HINTS = ("load", "store")  # a looped row's last pass: its stores stream (st.global.cs), and its
#                                   loads are the row's last use (ld.global.lu) where ``geo.last_use``
#                                   (geometry.LOOP_LAST_USE_BYTES); fewer only to measure without them
POINTWISE_THREADS = 128  # 128-1024 measured within noise of each other (H100, scripts/pointwise_probe.py)


def cute_dtype(dt):
    if dt in DTYPES:
        return DTYPES[dt]
    raise Unsupported(f"dtype {dt}")


# ---- value math -------------------------------------------------------------------------

def _compute_dtype(dt):
    return torch.float32 if dt in LOW_PRECISION else dt


def _cast(x, dt):
    if isinstance(x, (bool, int, float)):
        return x if dt.is_floating_point or dt == torch.bool else int(x)
    if packed_narrowing.packs(x, cute_dtype(dt)):
        return packed_narrowing.narrow(x, cute_dtype(dt))
    return x.to(cute_dtype(dt))


def _where(c, a, b, dt=None):
    """``torch.where`` over any mix of vectors (``TensorSSA``), run-time scalars (a row's
    reduced values) and Python constants: ``cute.where`` where any is a vector, the others
    broadcast to it (it takes a scalar branch beside a vector one, but neither a scalar
    condition nor two scalar branches), else ``select_``. ``dt``: the torch dtype of the
    result, for when both branches are constants (log_softmax's where(|max| == inf, 0.0, max))."""
    if isinstance(c, bool):
        return a if c else b
    typed = next((type(x) for x in (a, b) if isinstance(x, cutlass.Numeric)), None)
    typ = typed or next((x.dtype for x in (a, b) if isinstance(x, cute.TensorSSA)), None) or cute_dtype(dt)
    vec = next((x for x in (c, a, b) if isinstance(x, cute.TensorSSA)), None)
    if vec is not None:
        if not isinstance(c, cute.TensorSSA):
            c = cute.full(vec.shape, c, cutlass.Boolean)
        if not isinstance(a, cute.TensorSSA) and not isinstance(b, cute.TensorSSA):
            a = cute.full(vec.shape, a, typ)
        return cute.where(c, a, b)
    a, b = (typ(x) if isinstance(x, (bool, int, float)) else x for x in (a, b))
    return typ(cutlass.select_(c, a, b))  # a bare MLIR value: give it back its numeric type


def _maximum(a, b):  # NaN-propagating, like torch
    return _where(a != a, a, _where(a > b, a, b))


def _minimum(a, b):
    return _where(a != a, a, _where(a < b, a, b))


def _pow(a, b):
    if isinstance(b, (int, float)):
        if b == 2:
            return a * a
        if b == 1:
            return a
        if b == 0.5:
            return cute.math.sqrt(a)
        if b == 3:
            return a * a * a
    return cute.math.pow(a, b)


def _nonzero_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x != 0 and math.isfinite(x)


def _reciprocal(c, dt):
    """``1 / c`` for a division by the constant ``c``, as eager CUDA computes it: PyTorch's
    true division by a scalar multiplies by the reciprocal, taken in the op's math type
    (``div_true_kernel_cuda``), so ``x * (1 / c)`` is eager's result to the bit, and costs one
    multiply where ``div.rn.f32`` costs a dozen instructions and a slow-path branch (an
    exact GELU divides twice per element by sqrt(2))."""
    if dt == torch.float64:
        return 1.0 / c
    one = torch.tensor(1.0, dtype=torch.float32)
    return (one / torch.tensor(c, dtype=torch.float32)).item()


def _trunc_div(a, b, dt):
    """thunder's integer ``div``: the quotient rounded toward zero (C's ``/``). The DSL's ``//``
    floors, so where the remainder is not zero and the operands' signs differ add one."""
    if not dt.is_signed:  # bool and unsigned: the floor-to-trunc fix below assumes signs
        raise Unsupported(f"integer division on {dt}")
    if isinstance(a, int) and isinstance(b, int):
        return int(a / b) if b else 0
    q = a // b
    r = a - q * b
    return _where((r != 0) & ((a ^ b) < 0), q + 1, q)


UNARY_MATH = {
    "exp": cute.math.exp, "exp2": cute.math.exp2, "expm1": cute.math.expm1, "log": cute.math.log,
    "log1p": cute.math.log1p, "log2": cute.math.log2, "log10": cute.math.log10,
    "tanh": cute.math.tanh, "erf": cute.math.erf, "erfc": cute.math.erfc,
    "rsqrt": cute.math.rsqrt, "sqrt": cute.math.sqrt, "sin": cute.math.sin, "cos": cute.math.cos,
    "tan": cute.math.tan, "sinh": cute.math.sinh, "cosh": cute.math.cosh, "asin": cute.math.asin,
    "acos": cute.math.acos, "atan": cute.math.atan, "asinh": cute.math.asinh,
    "acosh": cute.math.acosh, "atanh": cute.math.atanh, "floor": cute.math.floor,
    "ceil": cute.math.ceil, "trunc": cute.math.trunc, "round": cute.math.roundeven,
    "abs": cute.math.abs, "neg": operator.neg, "reciprocal": lambda a: 1.0 / a,
}
BINARY_MATH = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "pow": _pow, "maximum": _maximum, "minimum": _minimum, "atan2": cute.math.atan2,
}
BITWISE = {"bitwise_and": operator.and_, "bitwise_or": operator.or_, "bitwise_xor": operator.xor}
COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
           "gt": operator.gt, "ge": operator.ge}


def _narrowed_operation(e):
    """``convert_element_type(op(a, b), dt)`` where ``op`` is an fp32 add, sub or mul of
    values widened from bf16 or fp16 ``dt`` (or constants exact in ``dt``): the
    operation computed in ``dt`` itself (``add.bf16x2``: no conversion at all) rounds to the
    same value, since fp32 carries more than twice ``dt``'s precision plus two bits. LLVM
    makes that rewrite itself only while the narrowing is not packed by hand; returns
    ``(op, operands)`` with the operands ``dt``-valued expressions or constants, else None."""
    if not (isinstance(e, Op) and e.op == "convert_element_type" and e.dtype in LOW_PRECISION):
        return None
    inner = e.args[0]
    if not (isinstance(inner, Op) and inner.op in ("add", "sub", "mul") and inner.dtype == torch.float32):
        return None
    operands = []
    for a in inner.args:
        if isinstance(a, float) and torch.tensor(a, dtype=e.dtype).item() == a:
            operands.append(a)
        elif isinstance(a, Op) and a.op == "convert_element_type" and dtype_of(a.args[0]) == e.dtype:
            operands.append(a.args[0])
        else:
            return None
    return inner.op, operands


def apply_op(e: Op, args, arg_dtypes):
    """One node of the tree on vectors (or row scalars); ``arg_dtypes`` are torch dtypes."""
    op, out = e.op, e.dtype
    if op == "convert_element_type":
        return _cast(args[0], out)
    if op in UNARY_MATH:
        if not out.is_floating_point and op not in ("neg", "abs"):
            raise Unsupported(f"{op} on {out}")
        cd = _compute_dtype(out)
        return _cast(UNARY_MATH[op](_cast(args[0], cd)), out)
    if op in BINARY_MATH:
        if op == "div" and not out.is_floating_point:
            return _trunc_div(_cast(args[0], out), _cast(args[1], out), out)
        cd = _compute_dtype(out)
        if op == "div" and _nonzero_number(args[1]) and not _nonzero_number(args[0]):
            return _cast(_cast(args[0], cd) * _reciprocal(args[1], cd), out)
        return _cast(BINARY_MATH[op](_cast(args[0], cd), _cast(args[1], cd)), out)
    if op in COMPARE:
        tensor_dts = [d for d in arg_dtypes if isinstance(d, torch.dtype)]
        cd = tensor_dts[0]
        for d in tensor_dts[1:]:
            cd = torch.promote_types(cd, d)
        cd = _compute_dtype(cd)
        return COMPARE[op](_cast(args[0], cd), _cast(args[1], cd))
    if op in BITWISE or op == "bitwise_not":  # bool or integer operands, the output's dtype
        if out.is_floating_point:
            raise Unsupported(f"{op} on {out}")
        if op == "bitwise_not":  # no ~ on vectors: xor with all ones
            return _cast(args[0], out) ^ (True if out == torch.bool else -1)
        return BITWISE[op](_cast(args[0], out), _cast(args[1], out))
    if op == "where":
        cd = _compute_dtype(out)
        return _cast(_where(args[0], _cast(args[1], cd), _cast(args[2], cd), cd), out)
    if op == "lerp":
        cd = _compute_dtype(out)
        a, b, w = (_cast(x, cd) for x in args)
        return _cast(a + w * (b - a), out)
    if op == "signbit" and isinstance(arg_dtypes[0], torch.dtype) and arg_dtypes[0].is_signed \
            and not arg_dtypes[0].is_floating_point:  # a float's -0.0 and -NaN: not here
        return _cast(args[0], arg_dtypes[0]) < 0
    if op == "fmod" and not out.is_floating_point:  # the remainder of the truncated quotient
        a, b = _cast(args[0], out), _cast(args[1], out)
        return a - _trunc_div(a, b, out) * b
    if op == "isfinite":
        a = _cast(args[0], torch.float32)
        return cute.math.isfinite(a)
    raise Unsupported(f"no kernel code for {op}")


def _is_bf16_rounded_tanh(e) -> bool:
    return (isinstance(e, Op) and e.op == "convert_element_type" and e.dtype == torch.bfloat16
            and isinstance(e.args[0], Op) and e.args[0].op == "tanh" and e.args[0].dtype == torch.float32)


def _is_division_by_a_softmax_sum(e) -> bool:
    """``a / sum(exp(x - amax(x)))`` in fp32, the sum and the max over one row of one ``x``.
    Such a divisor is at least 1 (the row's maximum contributes exp(0)) and at most the row
    length (or NaN), so its reciprocal is a normal float: ``a * (1 / b)``, corrected once, is
    as exact as the division. The division itself is not cheap here: ``div.rn.f32`` takes a
    slow path for a zero numerator, and under a causal mask half of the numerators are
    exp(-inf) = 0 (the GPT block's attention softmax ran at 1.91 TB/s dividing, 2.92 with
    one reciprocal per row: ``scripts/div_probe.py``)."""
    if not (isinstance(e, Op) and e.op == "div" and e.dtype == torch.float32):
        return False
    total = e.args[1]
    if not (isinstance(total, Reduce) and total.op == "sum" and isinstance(total.arg, Op) and total.arg.op == "exp"):
        return False
    diff = total.arg.args[0]
    if not (isinstance(diff, Op) and diff.op == "sub"):
        return False
    x, peak = diff.args
    return isinstance(peak, Reduce) and peak.op == "amax" and peak.arg is x


class Evaluator:
    """Evaluates expressions for one vector (``load`` gives a leaf's vector); row results
    come from ``row_value`` (shared by every chunk of a row)."""

    def __init__(self, load, row_value, select):
        self.load, self.row_value, self.select = load, row_value, select
        self.memo: dict[int, object] = {}

    def ev(self, e):
        if isinstance(e, (bool, int, float)):
            return e
        r = self.memo.get(id(e))
        if r is not None:
            return r
        if isinstance(e, Load):
            r = self.load(e)
        elif isinstance(e, Reduce):
            r = self.row_value(e)
        elif _is_bf16_rounded_tanh(e):
            # fast-math tanh lowers to tanh.approx.f32 (one instruction, relative error below
            # 2**-10.9) where the result is rounded to bf16 at once (half an ulp there is 2**-9):
            # at most one bf16 ulp from the exact tanh, which costs a dozen instructions
            t = self.memo.get(id(e.args[0]))  # the exact tanh, where an unrounded use needed it already
            if t is None:
                t = cute.math.tanh(_cast(self.ev(e.args[0].args[0]), torch.float32), fastmath=True)
            r = _cast(t, torch.bfloat16)
        elif (narrowed := _narrowed_operation(e)) is not None:
            op, operands = narrowed
            dt = cute_dtype(e.dtype)
            x, y = packed_narrowing.as_vectors(*(_cast(self.ev(a), e.dtype) for a in operands), dt)
            if op != "mul":
                r = BINARY_MATH[op](x, y)
            elif packed_narrowing.multiplies(x, y, dt):
                r = packed_narrowing.multiply(x, y, dt)
            else:  # a row scalar: in fp32
                r = _cast(x, torch.float32) * _cast(y, torch.float32)
            r = _cast(r, e.dtype)  # rounded here, or a widening consumer would read it unrounded
        elif _is_division_by_a_softmax_sum(e):
            a, b = (_cast(self.ev(x), torch.float32) for x in e.args)
            inv = 1.0 / b  # once per row value: a scalar where ``b`` is one
            q = a * inv
            r = q + (a - q * b) * inv
        elif isinstance(e, Op):
            r = apply_op(e, [self.ev(a) for a in e.args], [dtype_of(a) for a in e.args])
        elif isinstance(e, Select):
            r = self.select(e, [self.ev(p) for p in e.pieces])
        else:
            raise Unsupported(f"cannot evaluate {e!r}")
        self.memo[id(e)] = r
        return r


# ---- run-time branches (the DSL rewrites control flow only in jit functions) -----------

@cute.jit
def _copy_if(src: cute.Tensor, dst: cute.Tensor, pred: cutlass.Boolean, hint: cutlass.Constexpr = None):
    """One vector between registers and global memory where ``pred``. ``hint`` (CACHE_HINTS):
    "store" streams it (st.global.cs), "load" marks it the line's last use (ld.global.lu);
    the L2 evicts such lines first. Whole 16-byte accesses of floats only (``_hinted``)."""
    if pred:
        if cutlass.const_expr(hint is None):
            cute.autovec_copy(src, dst)
        else:
            n = 128 // src.element_type.width  # elements per 16-byte access
            cute.copy(_hinted_copy_atom(hint, src.element_type),
                      cute.logical_divide(cute.coalesce(src), n), cute.logical_divide(cute.coalesce(dst), n))


def _hinted_copy_atom(hint: str, dtype):
    """A 16-byte copy of ``dtype`` to global memory that streams ("store"), or from it,
    marked the line's last use ("load")."""
    if hint == "store":
        return cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), dtype, num_bits_per_copy=128,
                                   store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING)
    return cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), dtype, num_bits_per_copy=128,
                               load_cache_mode=cute.nvgpu.LoadCacheMode.LAST_USE)


@cute.jit
def _gather_if(frag: cute.Tensor, t2: cute.Tensor, m, n0, limit, pred: cutlass.Boolean, width: cutlass.Constexpr,
               edge: cutlass.Constexpr = False):
    """Elements ``n0 ..`` of row ``m`` below ``limit``; an ``edge`` vector of a flat row
    (``geometry.flat_rows``) starts before the row, whose elements there are not read."""
    for k in cutlass.range_constexpr(width):
        if pred and n0 + k < limit and (not edge or n0 + k >= 0):
            frag[k] = frag.element_type(t2[(m, n0 + k)])  # a bool element reads as Int8 (see _move_if_full)


@cute.jit
def _lanes_inside(n0, limit, pred: cutlass.Boolean, width: cutlass.Constexpr):
    """Which of elements ``n0 .. n0 + width`` lie in ``[0, limit)`` (where ``pred``), as a
    vector of booleans."""
    lanes = cute.make_rmem_tensor((1, width), cutlass.Boolean)
    for k in cutlass.range_constexpr(width):
        lanes[k] = pred & (n0 + k >= 0) & (n0 + k < limit)
    return lanes.load()


@cute.jit
def _scatter_if(frag: cute.Tensor, t2: cute.Tensor, m, n0, limit, pred: cutlass.Boolean, width: cutlass.Constexpr,
                edge: cutlass.Constexpr = False):
    for k in cutlass.range_constexpr(width):
        if pred and n0 + k < limit and (not edge or n0 + k >= 0):
            t2[(m, n0 + k)] = frag[k]


@cute.jit
def _move_if_full(frag: cute.Tensor, tile: cute.Tensor, t2: cute.Tensor, m, n0, limit, pred: cutlass.Boolean,
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
def _put_if(frag: cute.Tensor, value, pred: cutlass.Boolean):
    if pred:
        frag.store(value)


@cute.jit
def _store_scalar_if(t2: cute.Tensor, m, n, value, pred: cutlass.Boolean):
    if pred:
        t2[(m, n)] = value


@cute.jit
def _load_scalar_if(t2: cute.Tensor, m, n, pred: cutlass.Boolean):
    v = t2.element_type(0)
    if pred:
        v = t2[(m, n)]
    return v


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


# ---- shared pieces ------------------------------------------------------------------------

def _as_2d(t: cute.Tensor, rank: int) -> cute.Tensor:
    if rank == 1:
        return cute.make_tensor(t.iterator, cute.make_layout((1, t.shape[0]), stride=(0, t.stride[0])))
    if rank == 2:
        return t
    return cute.group_modes(t, 0, rank - 1)


def _flat_view(t2: cute.Tensor, start, count, V: int) -> cute.Tensor:
    """A flat row's vector view (``geometry.flat_rows``): the ``count`` vectors of the flat
    run of rows from element ``start`` (a multiple of ``V``) on, ``((1, V), (rows, count))``,
    its row mode of stride 0 so that the row's coordinate indexes it as any vector view."""
    layout = cute.make_layout(((1, V), (t2.shape[0], count)), stride=((0, 1), (0, V)))
    return cute.make_tensor(t2.iterator + start, layout)


def _vector_view(t2: cute.Tensor, V: int) -> cute.Tensor:
    """``t2`` tiled into ``(1, V)`` vectors along its second mode: ``((1, V), (M, nvec))``.
    Built from the strides rather than by ``zipped_divide``, which divides the hierarchical
    row mode by 1 and so costs a division per mode and per access at run time."""
    rows, n = t2.shape
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
            shape, stride = mapped_layout(m, b.shape, b.stride, None if i == ref else out[ref].shape)  # built first
            out[i] = cute.make_tensor(ptr, cute.make_layout(shape, stride=stride))
    return tuple(out)


def _operand_views(ts, geo: Geometry, rank: int, V: int, ref_slot: int):
    """Every operand as 2-D ``(M, N)`` and tiled by vectors, and the extents of the domain
    (read from a stored operand: pieces of a cat have their own ``N``)."""
    ts = _from_bases(ts, geo)
    t2s = tuple(_as_2d(t, rank) for t in ts)
    tvs = tuple(_vector_view(t, V) for t in t2s)
    ref = t2s[ref_slot]
    return t2s, tvs, cute.size(ref, mode=[0]), cute.size(ref, mode=[1])


def _row_coord(t2: cute.Tensor, m, rank: int, group: tuple = ()):
    """Row ``m`` as a coordinate of the hierarchical first mode, innermost first, divided
    out once per thread from ``t2``'s extents: every operand then indexes with it by
    multiply-adds alone (CuTe would divide a linear index once per operand and access).
    ``group`` = (mode, rows): ``m`` counts groups of ``rows`` along that mode, and the
    coordinate's entry there is the group's index."""
    if rank <= 2:
        return m
    extents = list(t2.shape[0][:-1])
    if group and group[0] < len(extents):
        r, rows = group
        extents[r] = (extents[r] + rows - 1) // rows
    coord = []
    for s in extents:
        q = m // s
        coord.append(m - q * s)
        m = q
    return tuple(coord) + (m,)


def _mode_extent(t2: cute.Tensor, rank: int, r: int):
    return cute.size(t2, mode=[0]) if rank <= 2 else t2.shape[0][r]


def _with_entry(coord, r: int, value):
    """``coord`` with entry ``r`` replaced (-1: the outermost, an outer select's piece row)."""
    if not isinstance(coord, tuple):
        return value
    r %= len(coord)
    return tuple(value if i == r else c for i, c in enumerate(coord))


def _entry(coord, r: int):
    return coord[r] if isinstance(coord, tuple) else coord


def fake_operands(geo: Geometry):
    """Fake tensors with symbolic extents and strides: only what the signature fixes is
    static (strides 0 and 1, piece extents)."""
    outer = [cute.sym_int32() for _ in geo.outer]
    n_div = 1 if geo.tail or geo.flat else geo.vector  # flat rows: N is any length (``geometry.flat_rows``)
    n = cute.sym_int32(divisibility=n_div)
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
        bshape, bstride = [cute.sym_int32() for _ in range(ndim)], [cute.sym_int64() for _ in range(ndim)]
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


def _mode(o, V) -> str:
    """How a thread reads its ``V`` elements of operand ``o``: one vector access (stride 1),
    one element for all (stride 0), or ``V`` element accesses."""
    mode = o.inner_mode
    return "gather" if mode == "vec" and V == 1 else mode


def _frag(shape, dt):
    return cute.make_rmem_tensor(shape, cute_dtype(dt))


def _iota_at(o, t2, m, n, k: int = 0):
    """Element ``(m, n)`` of an iota operand, ``k`` positions further along a stride-1
    ``N``, computed from its index in the view: the value ``start + step * index`` of the
    vector it views. A causal mask compares two of these per element, which a kernel
    otherwise loads as 8-byte integers, with the registers to hold them."""
    return _iota_value(o, cutlass.Int64(cute.crd2idx((m, n), t2.layout)), k)


def _iota_value(o, idx, k: int = 0):
    start, step, off = o.iota
    if step != 1:  # 64-bit multiplies are several instructions: the usual arange has none
        idx = idx * step
    return cute_dtype(o.dtype)(idx + (start + step * (off + k)))


def _load_vector(o, t2, tv, m, j, V, N, pred, tail=False, hint=None, shift=None):
    """Vector ``j`` of row ``m`` of operand ``o``: one access (stride 1), one element for all
    (stride 0) or ``V`` accesses; zeros where ``pred`` is false. ``tail``: ``N`` may end
    inside the vector (1-D pointwise only). An iota operand is computed, not loaded.
    ``shift``: ``j`` counts the vectors of a flat row (``geometry.flat_rows``), whose first
    ``shift`` elements are the row before's: read element by element, the row's only (an
    edge vector, or an operand that does not move whole vectors: ``_shifted``)."""
    mode = _mode(o, V)
    if mode == "bcast":
        one = _frag((1, 1), o.dtype)
        if o.iota is not None:
            one[0] = _iota_at(o, t2, m, 0)
        else:
            one.fill(0)
            _gather_if(one, t2, m, 0, 1, pred, 1)
        return one.load().broadcast_to((1, V)) if V > 1 else one.load()
    frag = _frag((1, V), o.dtype)
    if o.iota is not None and mode == "vec":
        first = cutlass.Int64(cute.crd2idx((m, j * V), t2.layout))  # one index per vector
        for k in range(V):
            frag[k] = _iota_value(o, first, k)
        return frag.load()
    if o.iota is not None:
        for k in range(V):
            frag[k] = _iota_at(o, t2, m, j * V + k)
        return frag.load()
    frag.fill(0)
    if mode == "vec" and shift is not None:
        _gather_if(frag, t2, m, j * V - shift, N, pred, V, True)
    elif mode == "vec" and not tail:
        _copy_if(tv[(None, (m, j))], frag, pred, None if o.same_every_row else _hinted(hint, frag))
    elif mode == "vec":
        _move_if_full(frag, tv[(None, (m, j))], t2, m, j * V, N, pred, V, False)
    else:
        _gather_if(frag, t2, m, j * V, N, pred, V)
    return frag.load()


def _store_vector(val, o, t2, tv, m, j, V, N, pred, tail=False, hint=None, shift=None):
    frag = _frag((1, V), o.dtype)
    frag.store(_vector(val, V, o.dtype))
    mode = _mode(o, V)
    if mode == "vec" and shift is not None:
        _scatter_if(frag, t2, m, j * V - shift, N, pred, V, True)
    elif mode == "vec" and not tail:
        _copy_if(frag, tv[(None, (m, j))], pred, _hinted(hint, frag))
    elif mode == "vec":
        _move_if_full(frag, tv[(None, (m, j))], t2, m, j * V, N, pred, V, True)
    else:
        _scatter_if(frag, t2, m, j * V, N, pred, V)


def _hinted(hint, frag):
    """``hint`` where a vector is whole 16-byte accesses of floats, which the hinted copy moves."""
    t = frag.element_type
    return hint if t in (cutlass.Float32, cutlass.Float16, cutlass.BFloat16) and (cute.size(frag) * t.width) % 128 == 0 else None


def _no_select(e, pieces):
    raise Unsupported("cat/pad in a reduction kernel")


def _row_evaluator(geo: Geometry, t2s, m, n, pred, row_value) -> "Evaluator":
    """An evaluator for one value per row (``n == 0``) or per column (``m == 0``): its
    loads are row-shaped inputs, read as scalars."""

    def load(ld: Load):
        if not ld.row:
            raise Unsupported(f"{ld.source.name} read in a per-row value")
        slot = geo.load_slot[id(ld)]
        if geo.operands[slot].iota is not None:
            return _iota_at(geo.operands[slot], t2s[slot], m, n)
        return _load_scalar_if(t2s[slot], m, n, pred)

    return Evaluator(load, row_value, _no_select)


def _vector_evaluator(geo: Geometry, t2s, tvs, m, j, N, pred, row_value, hint=None, shift=None,
                      edge=False) -> "Evaluator":
    """An evaluator for vector ``j`` of row ``m`` that reads each operand once. ``shift``,
    ``edge``: see ``_shifted``."""
    loaded = {}

    def load(ld: Load):
        slot = geo.load_slot[id(ld)]
        if slot not in loaded:
            o = geo.operands[slot]
            loaded[slot] = _load_vector(o, t2s[slot], tvs[slot], m, j, geo.vector, N, pred, hint=hint,
                                        shift=_shifted(geo, o, shift, edge))
        return loaded[slot]

    return Evaluator(load, row_value, _no_select)


def _shifted(geo: Geometry, o, shift, edge: bool):
    """The shift by which a flat row (``_flat_row_views``: its first element lies ``shift``
    elements into its first vector) reads operand ``o`` element by element, or None where it
    moves whole vectors of it: every operand of an ``edge`` vector, shared with a
    neighbouring row, and, in every vector, an operand without vector access (a weight)."""
    return shift if shift is not None and (edge or not vector_access(geo, o)) else None


def _flat_row_edges(rt, Tr: int, V: int, shift, count, N, row_ok) -> list:
    """The chunks of width 1 (element index, predicate, 1) by which a row in registers
    (``build_rows``' ``body``) holds the elements of its flat run's two edge vectors
    (``_flat_row_views``): their 2 * V elements, one per thread, ``rt``, ``rt + Tr``, ...
    Held as whole vectors on two threads, they cost every thread their registers (117
    against 63 per thread for a softmax over rows of 16385 bf16, 512 threads)."""
    chunks = []
    for i in range(-(-2 * V // Tr)):
        e = rt + i * Tr  # the first vector's elements, then the last's
        col = _where(e < V, e - shift, (count - 1) * V - shift + (e - V))
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
    views = tuple(_flat_view(t2s[s], base, count, V) if vector_access(geo, o) else tvs[s]
                  for s, o in enumerate(geo.operands))
    return shift, count, views


# ---- pointwise ---------------------------------------------------------------------------

def _pointwise_pieces(prog: Program, geo: Geometry):
    """The pointwise template in two pieces, so that several independent programs can share
    a launch: ``setup(ts)`` (host side of the launch: the operand views, the extents a
    thread needs, and the block count) and ``thread(args, lin)`` (one thread's work; ``lin``
    its index within the program's blocks)."""
    if geo.flat:
        return _flat_pointwise_pieces(prog, geo)
    V, T = geo.vector, POINTWISE_THREADS
    rank = len(geo.outer) + 1
    ops = geo.operands
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
        row_at = _entry(m, -1) if outer_dim is not None else None  # the position along an outer select

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
                    row = _with_entry(m, -1, row_at - shift)
                else:  # pieces start at multiples of V (geometry's vector fit)
                    n = o.shape[-1]
                    pred = pred & (n0 >= shift) & (n0 < shift + n)
                    vec, tail = j - shift // V, False
            val = _load_vector(o, t2s[slot], tvs[slot], row, vec, V, n, pred, tail)
            cache[key] = val
            return val

        def select(e: Select, pieces):
            out = _frag((1, V), e.dtype)
            out.fill(e.fill)
            pos = at(e.dim)
            for p, lo, hi in zip(pieces, e.bounds, e.bounds[1:]):
                _put_if(out, _vector(p, V, e.dtype), (pos >= lo) & (pos < hi))
            return out.load()

        ev = Evaluator(load, None, select)
        return [ev.ev(st.expr) for st in prog.stores]

    def store(vals, t2s, tvs, m, j, N, row_ok):
        for val, slot in zip(vals, geo.store_slot):
            _store_vector(val, ops[slot], t2s[slot], tvs[slot], m, j, V, N, row_ok, geo.tail)

    def thread(args, lin):
        t2s, tvs, M, N, nvec = args
        m = lin // nvec
        j = lin - m * nvec
        coord = _row_coord(t2s[ref_slot], m, rank, reuse)
        if not reuse:
            store(values(t2s, tvs, coord, j, N, m < M, {}), t2s, tvs, coord, j, N, m < M)
        else:
            # all rows' loads first, then all stores: a store may alias a later row's load as far
            # as the compiler knows, so interleaving them would serialize the rows' memory accesses
            r, rows = reuse
            extent = _mode_extent(t2s[ref_slot], rank, r)
            first = _entry(coord, r) * rows
            shared, pending = {}, []
            for u in range(rows):  # unrolled: a plain function, traced
                row, ok = _with_entry(coord, r, first + u), (m < M) & (first + u < extent)
                pending.append((values(t2s, tvs, row, j, N, ok, shared), row, ok))
            for vals, row, ok in pending:
                store(vals, t2s, tvs, row, j, N, ok)

    def setup(ts):
        t2s, tvs, M, N = _operand_views(ts, geo, rank, V, ref_slot)
        if reuse:
            extent = _mode_extent(t2s[ref_slot], rank, reuse[0])
            M = M // extent * ((extent + reuse[1] - 1) // reuse[1])  # groups of rows
        nvec = (N + V - 1) // V
        return (t2s, tvs, M, N, nvec), (M * nvec + T - 1) // T

    return setup, thread, values


def _flat_pointwise_pieces(prog: Program, geo: Geometry):
    """``_pointwise_pieces`` over a flat run (``geometry.flat_rows``): thread ``lin`` computes
    vector ``lin`` of the rows back to back, which may span two rows. The operands laid out
    so (``vector_access``) move whole vectors, but for the run's last vector, which may end
    inside it (element by element: N >= V puts all of it in the last row); every other
    operand (a bias along the rows, a value per row) element by element at each element's
    row and column."""
    V, T = geo.vector, POINTWISE_THREADS
    ops = geo.operands
    whole = [vector_access(geo, o) for o in ops]

    def setup(ts):
        t2s, tvs, M, N = _operand_views(ts, geo, 2, V, geo.store_slot[0])
        count = ((cutlass.Int64(M) * N.to(cutlass.Int64) + V - 1) // V).to(cutlass.Int32)
        tvs = tuple(_flat_view(t2s[s], 0, count, V) if whole[s] else tvs[s] for s in range(len(ops)))
        return (t2s, tvs, M, N, count), (count + T - 1) // T

    def thread(args, lin):
        t2s, tvs, M, N, count = args
        first = cutlass.Int64(lin) * V  # the vector's first element in the run
        m = (first // N.to(cutlass.Int64)).to(cutlass.Int32)
        n0 = (first - cutlass.Int64(m) * N.to(cutlass.Int64)).to(cutlass.Int32)
        ok = lin < count
        # the limit a whole vector's moves see: past the vector, but N for the run's last
        limit = _where(lin == count - 1, N, n0 + V)
        loaded = {}

        def load(ld: Load):
            slot = geo.load_slot[id(ld)]
            if slot not in loaded:
                frag = _frag((1, V), ops[slot].dtype)
                frag.fill(0)
                if whole[slot]:
                    _move_if_full(frag, tvs[slot][(None, (0, lin))], t2s[slot], m, n0, limit, ok, V, False)
                else:
                    _gather_across_rows(frag, t2s[slot], m, n0, M, N, V)
                loaded[slot] = frag.load()
            return loaded[slot]

        ev = Evaluator(load, None, _no_select)
        for st, slot in zip(prog.stores, geo.store_slot):
            frag = _frag((1, V), ops[slot].dtype)
            frag.store(_vector(ev.ev(st.expr), V, ops[slot].dtype))
            _move_if_full(frag, tvs[slot][(None, (0, lin))], t2s[slot], m, n0, limit, ok, V, True)

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
        row = cutlass.min(_where(wraps, m + 1, m), last)
        frag[k] = frag.element_type(t2[(row, _where(wraps, n0 + k - N, n0 + k))])


def build_pointwise(prog: Program, geo: Geometry):
    if geo.stage:
        return build_pointwise_staged(prog, geo)
    setup, thread, _ = _pointwise_pieces(prog, geo)
    T = POINTWISE_THREADS

    @cute.kernel
    def kernel(t2s, tvs, M: cutlass.Int32, N: cutlass.Int32, nvec: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        thread((t2s, tvs, M, N, nvec), bidx * T + tidx)

    @cute.jit
    def launch(ts, stream):
        (t2s, tvs, M, N, nvec), blocks = setup(ts)
        kernel(t2s, tvs, M, N, nvec).launch(grid=[blocks, 1, 1], block=[T, 1, 1], stream=stream)

    return launch


def build_pointwise_group(progs: list, geos: list):
    """Independent pointwise programs in one launch: the grid is their blocks one after the
    other, and a block runs the program its index falls in (schedule.launch_steps)."""
    pieces = [_pointwise_pieces(p, g) for p, g in zip(progs, geos)]
    T = POINTWISE_THREADS

    @cute.kernel
    def kernel(args, starts):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        for i in cutlass.range_constexpr(len(pieces)):
            if (bidx >= starts[i]) & (bidx < starts[i + 1]):
                pieces[i][1](args[i], (bidx - starts[i]) * T + tidx)  # no member stages (launch_group)

    @cute.jit
    def launch(ts_list, stream):
        args, starts = [], [cutlass.Int32(0)]
        for i in cutlass.range_constexpr(len(pieces)):
            a, blocks = pieces[i][0](ts_list[i])
            args.append(a)
            starts.append(starts[-1] + blocks)
        kernel(tuple(args), tuple(starts)).launch(grid=[starts[-1], 1, 1], block=[T, 1, 1], stream=stream)

    return launch


def build_pointwise_staged(prog: Program, geo: Geometry):
    """A pointwise program whose operands in ``geo.stage`` are contiguous along outer mode
    ``r`` and strided along N (x + y.t()): each block takes a tile of rows along ``r`` by
    vectors along N (``geometry.stage_tile``: a 128-byte line of each row). First the block
    copies the staged operands' tiles into shared memory, consecutive threads reading
    consecutive rows (each warp a contiguous run of that operand); then each thread
    computes its vectors as the plain template does, reading the staged operands from the
    tiles along N. A tile row is padded to an odd number of 32-bit words, so both walks are
    free of bank conflicts where the staged operand is as wide as the narrowest vector
    operand (fp32 tiles beside bf16 vectors read with two-way conflicts)."""
    V, T = geo.vector, POINTWISE_THREADS
    TR, TJ = stage_tile(geo)
    TN = TJ * V
    rank = len(geo.outer) + 1
    r, slots = geo.stage
    ops = geo.operands
    ref_slot = geo.store_slot[0]
    _, _, values = _pointwise_pieces(prog, geo)
    pitch = {s: TN + 4 // ops[s].dtype.itemsize for s in slots}

    def body(t2s, tvs, N, nvec, tiles_n, tidx, bidx):  # plain Python, traced into the kernel
        smem = cutlass.utils.SmemAllocator()
        tiles = {s: smem.allocate_tensor(cute_dtype(ops[s].dtype), cute.make_layout((TR, TN), stride=(pitch[s], 1)), 16)
                 for s in slots}
        group = bidx // tiles_n
        jt = bidx - group * tiles_n
        coord = _row_coord(t2s[ref_slot], group, rank, (r, TR))
        extent = _mode_extent(t2s[ref_slot], rank, r)
        first = _entry(coord, r) * TR
        # the staged operands' tiles, consecutive threads along r: every load issued before the
        # first store into the tile waits for one
        rr = tidx % TR
        row = _with_entry(coord, r, first + rr)
        loaded = []
        for i in range(TR * TN // T):
            nn = (i * T + tidx) // TR
            ok = (first + rr < extent) & (jt * TN + nn < N)
            loaded += [(s, nn, _load_scalar_if(t2s[s], row, jt * TN + nn, ok)) for s in slots]
        for s, nn, value in loaded:
            tiles[s][(rr, nn)] = value
        cute.arch.sync_threads()
        pending = []  # the program, a vector at a time; all loads before the stores (see _pointwise_pieces)
        for i in range(TR * TJ // T):
            idx = i * T + tidx
            rr = idx // TJ
            jj = idx - rr * TJ
            j = jt * TJ + jj
            row = _with_entry(coord, r, first + rr)
            ok = (first + rr < extent) & (j < nvec)
            staged = {s: _tile_vector(tiles[s], rr, jj * V, V) for s in slots}
            pending.append((values(t2s, tvs, row, j, N, ok, {}, staged), row, j, ok))
        for vals, row, j, ok in pending:
            for val, slot in zip(vals, geo.store_slot):
                _store_vector(val, ops[slot], t2s[slot], tvs[slot], row, j, V, N, ok)

    @cute.kernel
    def kernel(t2s, tvs, N: cutlass.Int32, nvec: cutlass.Int32, tiles_n: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        body(t2s, tvs, N, nvec, tiles_n, tidx, bidx)

    @cute.jit
    def launch(ts, stream):
        t2s, tvs, M, N = _operand_views(ts, geo, rank, V, ref_slot)
        extent = _mode_extent(t2s[ref_slot], rank, r)
        groups = M // extent * ((extent + TR - 1) // TR)
        nvec = (N + V - 1) // V
        tiles_n = (nvec + TJ - 1) // TJ
        kernel(t2s, tvs, N, nvec, tiles_n).launch(grid=[groups * tiles_n, 1, 1], block=[T, 1, 1], stream=stream)

    return launch


def _tile_vector(tile: cute.Tensor, row, n0, V: int):
    """``V`` consecutive elements of a shared-memory tile's row, one access each (the
    padded rows leave them no wider alignment)."""
    frag = cute.make_rmem_tensor((1, V), tile.element_type)
    for k in range(V):
        frag[k] = tile[(row, n0 + k)]
    return frag.load()


def _vector(x, V, dt):
    """``x`` as a ``(1, V)`` vector of ``dt`` (row scalars and numbers are broadcast)."""
    if isinstance(x, (bool, int, float)):
        return cute.full((1, V), x, cute_dtype(dt))
    if isinstance(x, cute.TensorSSA):
        return _cast(x, dt)
    return cute.full((1, V), _cast(x, dt), cute_dtype(dt))


# ---- rows ----------------------------------------------------------------------------------

# per reduction: the in-vector reduction, the combine of two fp32 values or vectors
# (NaN-propagating, like torch; threads, warps, blocks and splits all use it) and the identity
_VECTOR_OP = {"sum": cute.ReductionOp.ADD, "amax": cute.ReductionOp.MAX, "amin": cute.ReductionOp.MIN,
              "prod": cute.ReductionOp.MUL}
_COMBINE = {"sum": operator.add, "mean": operator.add, "amax": _maximum, "amin": _minimum, "prod": operator.mul}
_IDENTITY = {"sum": 0.0, "mean": 0.0, "amax": -math.inf, "amin": math.inf, "prod": 1.0}


def _result(r, dtype):
    """A row (or column) statistic, computed in fp32, as the dtype thunder gave it."""
    return r if dtype == torch.float32 else _cast(r, dtype)


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
    return _result(r, e.dtype)


def _centered(x, center):
    return x if center is None else (x - center) * (x - center)


@cute.jit
def _for_range(start, stop, step: cutlass.Constexpr, fn: cutlass.Constexpr):
    """A run-time loop whose body ``fn(i)`` is plain Python emitting IR (the DSL rewrites
    loops only in jit functions). Values leave the body through register tensors."""
    for i in cutlass.range(start, stop, step):
        fn(i)


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
        return _across_threads(part, op, tidx, Tr, warps, acc_iter)

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
            return _shifted(geo, o, shift, False) if width == V else None

        loaded = {}
        row_cache: dict = {}
        means: dict = {}
        acc_iter = iter(accs)

        def load_chunk(c):
            j, ok, width = at[c]

            def load(ld: Load):
                slot = geo.load_slot[id(ld)]
                o = ops[slot]
                per_row = _mode(o, V) == "bcast"  # a per-row scalar is read once (per chunk width)
                key = (slot, ("row", width) if per_row else c)
                if key not in loaded:
                    loaded[key] = _load_vector(o, t2s[slot], tvs[slot], m, j, width, N, row_ok if per_row else ok,
                                               shift=shifted(o, width))
                return loaded[key]
            return load

        chunks = []

        def row_value(e: Reduce):
            if id(e) not in row_cache:
                row_cache[id(e)] = _row_statistic(e, reduce_registers, N, means)
            return row_cache[id(e)]

        def reduce_registers(op, arg, center):
            identity = cutlass.Float32(_IDENTITY[op])
            part = identity
            for c, ch in enumerate(chunks):
                r = _centered(_cast(ch.ev(arg), torch.float32), center).reduce(_VECTOR_OP[op], _IDENTITY[op], 0)
                part = _COMBINE[op](part, cutlass.Float32(cutlass.select_(chunk_ok[c], r, identity)))
            return finish(part, op, tidx, acc_iter)

        for c in range(len(at)):
            chunks.append(Evaluator(load_chunk(c), row_value, _no_select))
        for e, accs_of_sum in zip(sums, column_accs):
            for c, acc in enumerate(accs_of_sum):
                acc.store(acc.load() + _where(chunk_ok[c], _vector(chunks[c].ev(e.arg), V, torch.float32), 0.0))
        _store_row_values(prog, geo, t2s, m, row_ok & (rt == 0), row_value)
        for st, slot in zip(prog.stores, geo.store_slot):
            if not st.is_row and not st.across:
                for c, (j, ok, width) in enumerate(at):
                    _store_vector(chunks[c].ev(st.expr), ops[slot], t2s[slot], tvs[slot], m, j, width, N, ok,
                                  shift=shifted(ops[slot], width))

    def body_looped(t2s, tvs, m, rt, tidx, N, row_ok, accs):
        """One row per block of ``Tr`` threads; thread ``rt`` visits vectors rt, rt+Tr, ...
        in every pass, ``_unroll`` of them per loop step (``_loaded_batch``). Reductions
        run in dependency order (softmax: max, then the sum of exp(x - max)); a later pass
        reads the earlier results as row scalars. Flat rows (``geometry.flat_rows``): the
        loop walks the whole vectors inside the row, and threads 0 and 1 its edge vectors,
        shared with the rows before and after, element by element (``walk``)."""
        acc_iter = iter(accs)
        values: dict = {}
        shift = None  # flat rows: elements of the row before in the row's first vector
        first, end = 0, N // V  # the vectors the loop walks
        if geo.flat:
            shift, count, tvs = _flat_row_views(geo, t2s, tvs, m, N)
            first, end = 1, count - 1

        def batch(j, roots, hint=None):
            return _loaded_batch(geo, t2s, tvs, m, j, (0, Tr), row_ok, end, N, _streamed_loads(roots),
                                 lambda e: values[id(e)], hint, shift)

        def walk(roots, absorb, hint=None):
            """``absorb(vectors, edge_shift)`` for every step of this thread's walk of the
            row: ``vectors`` = [(evaluator, vector index, where its elements are the row's)],
            the last a predicate, or one per element for an edge vector (``edge_shift``: the
            row's shift there, None in the middle)."""

            def step(j):
                absorb([(ev, jj, pred) for ev, _, jj, pred in batch(j, roots, hint)], None)

            _for_range(rt + first, end, Tr * _unroll(geo), step)
            if shift is not None:
                def edge(i):  # i = 0: the row's first vector, 1: its last
                    jj = i * (count - 1)
                    ev = _vector_evaluator(geo, t2s, tvs, m, jj, N, row_ok, lambda e: values[id(e)], shift=shift,
                                           edge=True)
                    for ld in _streamed_loads(roots):
                        ev.ev(ld)
                    absorb([(ev, jj, _lanes_inside(jj * V - shift, N, row_ok, V))], shift)

                _for_range(rt, 2, Tr, edge)

        def reduce_pass(op, arg, center):
            acc = _frag((1, V), torch.float32)
            acc.fill(_IDENTITY[op])

            def absorb(vectors, _):
                for ev, _, keep in vectors:
                    x = _centered(_vector(ev.ev(arg), V, torch.float32), center)
                    acc.store(_COMBINE[op](acc.load(), _where(keep, x, _IDENTITY[op])))

            walk([arg], absorb)
            return finish(acc.load().reduce(_VECTOR_OP[op], _IDENTITY[op], 0), op, tidx, acc_iter)

        def online_pass(x_expr):
            """The row's max of ``x_expr`` and its sum of exp(x - max) in one pass: a thread
            keeps its running max and its sum relative to it, rescaled when the max grows (once
            per batch of vectors); the threads' sums are rescaled to the row's max, then added."""
            top = _frag((1, 1), torch.float32)
            top.fill(-math.inf)
            acc = _frag((1, V), torch.float32)
            acc.fill(0.0)

            def absorb(vectors, _):
                xs = [_where(keep, _vector(ev.ev(x_expr), V, torch.float32), -math.inf) for ev, _, keep in vectors]
                most = xs[0]
                for x in xs[1:]:
                    most = _maximum(most, x)
                new = _maximum(top[0], most.reduce(cute.ReductionOp.MAX, -math.inf, 0))
                shift = _finite_or_zero(new)
                total = acc.load() * _rescale(top[0], shift)
                for x in xs:
                    total = total + cute.math.exp(x - shift)
                acc.store(total)
                top[0] = new

            walk([x_expr], absorb)
            row_max = finish(top[0], "amax", tidx, acc_iter)
            row_shift = _finite_or_zero(row_max)
            mine = acc.load().reduce(cute.ReductionOp.ADD, 0.0, 0) * _rescale(top[0], row_shift)
            return row_max, row_shift, finish(mine, "sum", tidx, acc_iter)

        means: dict = {}
        order = reductions_in_order(prog)
        online: dict = {}  # a max -> its first softmax sum (a second one takes a pass of its own)
        for s, top, x_expr, center in softmax_sums(order) if ONLINE_SOFTMAX else ():
            online.setdefault(id(top), (s, x_expr, center))
        for e in order:
            if id(e) in values:  # a softmax sum, taken with its max
                continue
            if id(e) not in online:
                values[id(e)] = _row_statistic(e, reduce_pass, N, means)
                continue
            s, x_expr, center = online[id(e)]
            row_max, row_shift, total = online_pass(x_expr)
            values[id(e)] = row_max
            c = _row_evaluator(geo, t2s, m, 0, row_ok, lambda r: values[id(r)]).ev(center)
            values[id(s)] = _result(total * cute.math.exp(row_shift - c), s.dtype)
        _store_row_values(prog, geo, t2s, m, row_ok & (rt == 0), lambda e: values[id(e)])
        full = [(st, slot) for st, slot in zip(prog.stores, geo.store_slot) if not st.is_row]
        load_hint = "load" if geo.last_use and "load" in CACHE_HINTS else None
        store_hint = "store" if "store" in CACHE_HINTS else None

        def store(vectors, edge_shift):  # the row's last read, and stores no one reads here: neither should stay in L2
            for ev, jj, keep in vectors:
                for st, slot in full:  # an edge vector's elements are written where they are the row's
                    _store_vector(ev.ev(st.expr), ops[slot], t2s[slot], tvs[slot], m, jj, V, N,
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
        row_body(t2s, tvs, _row_coord(t2s[ref_slot], m, rank), rt, tidx, N, m < M,
                 _shared_accumulators(Tr, warps, n_reductions))

    @cute.jit
    def launch(ts, stream):
        t2s, tvs, M, N = _operand_views(ts, geo, rank, V, ref_slot)
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
    per-column values, as a column reduction's finalize does (``_partials_then_finalize``)."""
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
            column_accs.append([_frag((1, V), torch.float32) for _ in range(K)])
            for acc in column_accs[-1]:
                acc.fill(0.0)
        shared = _shared_accumulators(Tr, T // 32, n_reductions)
        row_blocks = (M + rows_per_block - 1) // rows_per_block

        def step(b):
            m = b * rows_per_block + slot
            body(t2s, tvs, _row_coord(t2s[ref_slot], m, rank), rt, tidx, N, m < M, shared, column_accs)

        _for_range(bx * per, cutlass.min(row_blocks, bx * per + per), 1, step)
        if rows_per_block > 1:  # _shared_accumulators allocated nothing (rows of a warp or less)
            add_row_slots([acc for accs in column_accs for acc in accs], slot, rt)
        for offset, accs_of_sum in zip(offsets, column_accs):
            for c, acc in enumerate(accs_of_sum):
                j = rt + c * Tr
                _scatter_if(acc, ws, bx, offset * N + j * V, offset * N + N, (slot == 0) & (j < N // V), V)

    per_column = [(st, slot) for st, slot in zip(prog.stores, geo.store_slot) if st.across]

    def finalize_body(t2s, ws, M, N, per, c, group, tidx):
        _finalize_column(per_column, geo, sums, offsets, t2s, ws, M, N, per, c, group, tidx)

    return _partials_then_finalize(
        geo, rank, ref_slot, T, partial_body, finalize_body,
        lambda ws, M, N: [cute.size(ws, mode=[0]), 1, 1], lambda M, N: N)


def _finite_or_zero(m):
    """What an online softmax subtracts for a running max ``m``: ``m``, or 0 where it is
    infinite (no finite value yet, or a +inf met), so that exp(x - it) is never inf - inf."""
    return cutlass.select_(m == -math.inf, cutlass.Float32(0.0),
                           cutlass.select_(m == math.inf, cutlass.Float32(0.0), m))


def _rescale(old, shift):
    """The factor that moves a sum of exp(x - ``_finite_or_zero(old)``) to exp(x - ``shift``)
    (the shift of a max no smaller than ``old``); 0 while ``old`` is -inf (the sum is 0 then,
    and exp(0 - shift) might overflow)."""
    return cutlass.select_(old == -math.inf, cutlass.Float32(0.0), cute.math.exp(_finite_or_zero(old) - shift))


def _unroll(geo: Geometry) -> int:
    """Vectors a thread loads per step of a loop: STREAM_UNROLL 16-byte vectors of the
    narrowest operand, so more where the vector is narrowed to the widest store's 16 bytes
    (``geometry.vector_width``): a step keeps as many bytes in flight. H100,
    scripts/long_rows_probe.py: log_softmax fp32 of bf16 [4096, 32000] (looped) took 0.315
    ms in 4 vectors of 8 per step, 0.333 in 4 of 4 and 0.289 in 8 of 4."""
    return STREAM_UNROLL * vector_width(geo.operands, False) // vector_width(geo.operands)


def _loaded_batch(geo: Geometry, t2s, tvs, m, j, step: tuple, ok, end, N, loads, row_value, hint=None,
                  shift=None) -> list:
    """One step of a thread's loop: (evaluator, row, vector index, predicate) of
    ``_unroll`` vectors, the u-th at ``(m + u * step[0], j + u * step[1])`` (along a row, or down a
    column), with ``loads`` issued for all before any math uses one. A vector whose moving
    coordinate is at or past ``end`` loads nothing. ``shift``: a flat row's (``_shifted``)."""
    batch = []
    for u in range(_unroll(geo)):
        # a coordinate that does not move stays as it is: a row's may be a tuple (outer modes that do not merge)
        mm = m + u * step[0] if step[0] else m
        jj = j + u * step[1] if step[1] else j
        pred = ok & ((mm if step[0] else jj) < end)
        ev = _vector_evaluator(geo, t2s, tvs, mm, jj, N, pred, row_value, hint, shift)
        for ld in loads:
            ev.ev(ld)
        batch.append((ev, mm, jj, pred))
    return batch


def _streamed_loads(roots) -> list:
    """The loads a loop step reads for ``roots`` (a reduction's operand loads are its own
    pass's, not these expressions')."""
    return [e for e in subexpressions(roots, into_reductions=False) if isinstance(e, Load)]


def _across_threads(part, op: str, tidx, Tr: int, warps: int, acc_iter):
    """A thread's partial of ``op`` reduced over the row's ``Tr`` threads: shuffles within a
    warp, then shared memory (the next of ``acc_iter``'s buffers) across the block's warps."""
    part = cute.arch.warp_reduction(part, _COMBINE[op], threads_in_group=min(Tr, 32))
    if Tr > 32:
        part = _block_reduce(part, next(acc_iter), tidx, warps, _COMBINE[op], _IDENTITY[op])
    return part


def _store_row_values(prog: Program, geo: Geometry, t2s, m, pred, row_value) -> None:
    """The program's per-row stores at row ``m`` (one thread's, where ``pred``)."""
    ev = _row_evaluator(geo, t2s, m, 0, pred, row_value)
    for st, slot in zip(prog.stores, geo.store_slot):
        if st.is_row:
            val = ev.ev(st.expr)
            if isinstance(val, cute.TensorSSA):
                raise Unsupported("a row result that is a vector")
            _store_scalar_if(t2s[slot], m, 0, _cast(val, geo.operands[slot].dtype), pred)


def _shared_accumulators(Tr, warps, count):
    if Tr <= 32:
        return []
    smem = cutlass.utils.SmemAllocator()
    return [smem.allocate_tensor(cutlass.Float32, warps + 1) for _ in range(count)]


def _count_reductions(prog: Program) -> int:
    """Shared-memory buffers a row kernel needs: two block reductions per reduction over the
    rows (var is a sum, then a sum of squared deviations), plus one. A sum per column takes
    none: each thread keeps its own columns."""
    found = sum(isinstance(e, Reduce) and not e.across for e in subexpressions(st.expr for st in prog.stores))
    return 2 * found + 1


# ---- columns -------------------------------------------------------------------------------

@cute.jit
def _groups_to_workspace(acc: cute.Tensor, buf: cute.Tensor, ws: cute.Tensor, tidx, split, col0, offset, N,
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
        _store_scalar_if(buf, tidx // 32, c, v, tidx % 32 < CL)
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
    after the other would each round at the size of the whole sum."""
    v = cutlass.Float32(0.0)
    lost = cutlass.Float32(0.0)
    if pred:
        for s0 in cutlass.range(group, cute.size(ws, mode=[0]), _groups() * FINALIZE_BATCH):
            for x in _split_batch(ws, s0, col, cutlass.Float32(0.0)):
                y = x - lost
                t = v + y
                lost = (t - v) - y
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
def _welford_groups_to_workspace(mean: cute.Tensor, m2: cute.Tensor, buf_mean: cute.Tensor, buf_m2: cute.Tensor,
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
    streamed = _streamed_loads([e.arg for e in reduces] + [st.expr for st, _ in full])

    def no_row_value(e):
        raise Unsupported("a reduction inside a column reduction's argument")

    def partial_body(t2s, tvs, ws, M, N, per, tidx, bx, split):
        j = bx * CW + tidx % CW
        ok = j < N // V
        start = split * per + tidx // CW  # this thread's first row
        r0 = split * per
        r1 = cutlass.min(M, r0 + per)
        first = _vector_evaluator(geo, t2s, tvs, start, j, N, ok & (start < r1), no_row_value)
        accs = []
        for e in reduces:
            if e.op == "var":  # Welford: running mean and sum of squared deviations
                mean, m2 = _frag((1, V), torch.float32), _frag((1, V), torch.float32)
                mean.fill(0.0)
                m2.fill(0.0)
                # the mean runs relative to the thread's first value (rounding then scales
                # with the spread, not the size of the mean), which is added back at the end
                shift = _frag((1, V), torch.float32)
                shift.store(_vector(first.ev(e.arg), V, torch.float32))
                accs.append((mean, m2, shift))
            else:
                a = _frag((1, V), torch.float32)
                a.fill(_IDENTITY[e.op])
                accs.append(a)

        def step(m):
            for ev, mm, _, pred in _loaded_batch(geo, t2s, tvs, m, j, (RG, 0), ok, r1, N, streamed, no_row_value):
                for st, slot in full:
                    _store_vector(ev.ev(st.expr), ops[slot], t2s[slot], tvs[slot], mm, j, V, N, pred)
                for e, acc in zip(reduces, accs):
                    x = _vector(ev.ev(e.arg), V, torch.float32)
                    if e.op == "var":
                        mean, m2, shift = acc
                        # one division per row, not per element: the count is the vector's
                        inv = cutlass.Float32(1.0) / ((mm - start) // RG + 1).to(cutlass.Float32)
                        mu = mean.load()
                        x = x - shift.load()
                        d = x - mu
                        mu_next = mu + d * inv
                        mean.store(_where(pred, mu_next, mu))
                        m2.store(_where(pred, m2.load() + d * (x - mu_next), m2.load()))
                    else:
                        acc.store(_COMBINE[e.op](acc.load(), _where(pred, x, _IDENTITY[e.op])))

        _for_range(start, r1, RG * _unroll(geo), step)
        smem = cutlass.utils.SmemAllocator()
        bufs = [smem.allocate_tensor(cutlass.Float32, V * T) for _ in range(2)]  # at most 16 KB
        col0 = bx * CW * V
        for e, acc, offset in zip(reduces, accs, offsets):
            if e.op == "var":
                mean, m2, shift = acc
                mean.store(mean.load() + shift.load())
                _welford_groups_to_workspace(mean, m2, *bufs, ws, tidx, split, col0, offset * N, r1 - r0, N, V, CW, RG)
            else:
                _groups_to_workspace(acc, bufs[0], ws, tidx, split, col0, offset * N, N, V, CW, RG, _COMBINE[e.op])

    def finalize_body(t2s, ws, M, N, per, c, group, tidx):
        _finalize_column(per_column, geo, reduces, offsets, t2s, ws, M, N, per, c, group, tidx)

    return _partials_then_finalize(
        geo, rank, ref_slot, T, partial_body, finalize_body,
        lambda ws, M, N: [(N // V + CW - 1) // CW, cute.size(ws, mode=[0]), 1], lambda M, N: N)


# ---- split rows ---------------------------------------------------------------------------

def build_split_rows(prog: Program, geo: Geometry):
    """Few long rows (a loss's mean, a norm over a whole tensor; ``geometry.SPLIT_MIN``),
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
    streamed = _streamed_loads([e.arg for e in reduces] + [st.expr for st, _ in full])

    def no_row_value(e):
        raise Unsupported("a reduction inside another's argument in a split row")

    def partial_body(t2s, tvs, ws, M, N, per, tidx, split, r):
        m = _row_coord(t2s[ref_slot], r, rank)
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
                first = _frag((1, V), torch.float32)
                first.store(_vector(_vector_evaluator(geo, t2s, tvs, m, j0, N, ok, no_row_value).ev(e.arg), V,
                                    torch.float32))
                c = c_of[id(e)] = first[0]
                terms += [(i, "sum", lambda x, c=c: x - c), (i, "sum", lambda x, c=c: (x - c) * (x - c))]
            else:
                terms.append((i, first_op[id(e)], lambda x: x))
        accs = []
        for _, op, _ in terms:
            a = _frag((1, 1), torch.float32)
            a.fill(_IDENTITY[op])
            accs.append(a)

        def step(j):
            for ev, _, jj, pred in _loaded_batch(geo, t2s, tvs, m, j, (0, T), ok, j1, N, streamed, no_row_value):
                for st, slot in full:
                    _store_vector(ev.ev(st.expr), ops[slot], t2s[slot], tvs[slot], m, jj, V, N, pred)
                for (i, op, f), a in zip(terms, accs):
                    v = f(_vector(ev.ev(reduces[i].arg), V, torch.float32)).reduce(_VECTOR_OP[op], _IDENTITY[op], 0)
                    a[0] = _COMBINE[op](a[0], cutlass.select_(pred, v, cutlass.Float32(_IDENTITY[op])))

        _for_range(j0 + tidx, j1, T * _unroll(geo), step)
        smem = iter(_shared_accumulators(T, warps, len(terms) + 1))
        sums = [_across_threads(a[0], op, tidx, T, warps, smem) for (_, op, _), a in zip(terms, accs)]
        it = iter(sums)
        for e, offset in zip(reduces, offsets):
            first_ok = ok & (tidx == 0)
            if e.op == "var":
                s1, s2 = next(it), next(it)
                _store_scalar_if(ws, split, offset * M + r, c_of[id(e)] + s1 / count, first_ok)
                # rounding could leave a split of nearly equal values a negative M2, and the
                # variance below zero (a NaN standard deviation)
                m2 = cutlass.max(s2 - s1 * s1 / count, cutlass.Float32(0.0))
                _store_scalar_if(ws, split, (offset + 1) * M + r, m2, first_ok)
            else:
                _store_scalar_if(ws, split, offset * M + r, next(it), first_ok)

    def finalize_body(t2s, ws, M, N, per, r, group, tidx):
        ok = r < M
        values = _combined_splits(reduces, offsets, ws, M, r, group, tidx, N, per * V, ok)
        m = _row_coord(t2s[ref_slot], cutlass.min(r, M - 1), rank)
        _store_row_values(prog, geo, t2s, m, ok & (group == 0), lambda e: values[id(e)])

    return _partials_then_finalize(
        geo, rank, ref_slot, T, partial_body, finalize_body, lambda ws, M, N: [cute.size(ws, mode=[0]), M, 1],
        lambda M, N: M)


def _finalize_column(per_column: list, geo: Geometry, reduces, offsets, t2s, ws, M, N, per, c, group, tidx) -> None:
    """Column ``c``'s values, from its partials in the workspace: ``reduces`` combined
    (``_combined_splits``), then each of the ``per_column`` stores, ``(store, slot)``,
    computed from them and stored by the first group."""
    ok = c < N
    values = _combined_splits(reduces, offsets, ws, N, c, group, tidx, M, per, ok)
    ev = _row_evaluator(geo, t2s, 0, c, ok, lambda e: values[id(e)])
    for st, slot in per_column:
        _store_scalar_if(t2s[slot], 0, c, _cast(ev.ev(st.expr), geo.operands[slot].dtype), ok & (group == 0))


def _combined_splits(reduces, offsets, ws, width, c, group, tidx, count, per, pred) -> dict:
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
            combine = _COMBINE[e.op]
            if e.op in ("sum", "mean"):
                part = _sum_splits(ws, col, group, pred)
            else:
                part = _combine_splits(ws, col, group, pred, combine, _IDENTITY[e.op])
            (r,) = _across_groups([part], lambda a, b: [combine(a[0], b[0])], tidx)
            if e.op == "mean":
                r = r / count.to(cutlass.Float32)
        values[id(e)] = _result(r, e.dtype)
    return values


def _partials_then_finalize(geo: Geometry, rank: int, ref_slot: int, T: int, partial_body, finalize_body, partial_grid,
                            finalized):
    """The two launches of a reduction split across blocks: ``partial_body(t2s, tvs, ws, M,
    N, per, tidx, block x, block y)`` over ``partial_grid(ws, M, N)`` in blocks of ``T``,
    then ``finalize_body(t2s, ws, M, N, per, c, group, tidx)`` for each of ``finalized(M,
    N)`` results ``c``, FINALIZE_COLUMNS of them per block of FINALIZE_THREADS."""
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

    @cute.jit
    def launch(ts, ws: cute.Tensor, per: cutlass.Int32, stream):
        t2s, tvs, M, N = _operand_views(ts, geo, rank, V, ref_slot)
        partial(t2s, tvs, ws, M, N, per).launch(grid=partial_grid(ws, M, N), block=[T, 1, 1], stream=stream)
        finalize(t2s, ws, M, N, per).launch(grid=[(finalized(M, N) + FINALIZE_COLUMNS - 1) // FINALIZE_COLUMNS, 1, 1],
                                            block=[FINALIZE_THREADS, 1, 1], stream=stream)

    return launch


def fake_workspace():
    """The column kernels' fp32 workspace ``[splits, reductions * N]``, extents symbolic."""
    return make_fake_tensor(cutlass.Float32, (cute.sym_int32(), cute.sym_int32()), (cute.sym_int64(), 1),
                            assumed_align=4)


def build_launch(prog: Program, geo: Geometry):
    if geo.columns:
        return build_columns(prog, geo)
    if geo.split_rows:
        return build_split_rows(prog, geo)
    return build_rows(prog, geo) if prog.family == "rows" else build_pointwise(prog, geo)
