"""The values a kernel computes: CuTe DSL types, casts and the math of one expression node.

CuTe DSL traces Python, so a kernel is a closure over its program: while CuTe traces the
``@cute.kernel`` body, plain Python walks the expression tree (``Evaluator``) and emits one
vector op per node (the tree is unrolled at trace time; nothing of it exists at run time).
Math on fp16/bf16 values runs in fp32 and rounds once per stored value, except where a
rounding to bf16 or fp16 is the program's own and two lanes pack (``packed_narrowing``).
Shared by every kernel family.
"""

from __future__ import annotations

import functools
import math
import operator

import cutlass
import cutlass.cute as cute
import torch
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm, vector
from cutlass.cutlass_dsl import T

from thunder_fuser import config
from thunder_fuser.backends.cute.dsl import packed_narrowing
from thunder_fuser.backends.cute.lower.expr import Load, Op, Reduce, Select, dtype_of
from thunder_fuser.backends.cute.unsupported import Unsupported

DTYPES = {
    torch.float32: cutlass.Float32, torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16,
    torch.float64: cutlass.Float64, torch.bool: cutlass.Boolean, torch.int8: cutlass.Int8,
    torch.uint8: cutlass.Uint8, torch.int16: cutlass.Int16, torch.int32: cutlass.Int32,
    torch.int64: cutlass.Int64,
}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def cute_dtype(dt):
    if dt in DTYPES:
        return DTYPES[dt]
    raise Unsupported(f"dtype {dt}")


def _compute_dtype(dt):
    return torch.float32 if dt in LOW_PRECISION else dt


def cast(x, dt):
    if isinstance(x, (bool, int, float)):
        return x if dt.is_floating_point or dt == torch.bool else int(x)
    if packed_narrowing.packs(x, cute_dtype(dt)):
        return packed_narrowing.narrow(x, cute_dtype(dt))
    return x.to(cute_dtype(dt))


def cute_where(c, a, b, dt=None):
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
        if typ is not cutlass.Int32 and typ is not cutlass.Boolean and issubclass(typ, cutlass.Integer):
            # a Python integer beside a vector of int64 (or int8, int16): the DSL takes the
            # number as Int32 and refuses the pair (thunder's nll_loss: where(t != -100, t, 0))
            a, b = (cute.full(vec.shape, x, typ) if isinstance(x, int) else x for x in (a, b))
        if typ is cutlass.Float64:  # likewise a Python float beside fp64 values (the DSL takes it as fp32)
            a, b = (cute.full(vec.shape, x, typ) if isinstance(x, (int, float)) else x for x in (a, b))
        return cute.where(c, a, b)
    a, b = (typ(x) if isinstance(x, (bool, int, float)) else x for x in (a, b))
    if isinstance(c, cutlass.Numeric) and type(c) is not cutlass.Boolean:
        c = c != 0  # a condition read from memory (a bool row value) holds a byte: select takes an i1
    return typ(cutlass.select_(c, a, b))  # a bare MLIR value: give it back its numeric type


def _is_f32(x) -> bool:
    """An fp32 run-time value (vector or scalar), or a Python float beside one."""
    if isinstance(x, cute.TensorSSA):
        return x.dtype is cutlass.Float32
    return type(x) is cutlass.Float32 or isinstance(x, float)


def _f32_lanes(fn, a, b):
    """``fn(a, b)`` on fp32 scalars, lane by lane where either is a vector."""
    vec = next((x for x in (a, b) if isinstance(x, cute.TensorSSA)), None)
    if vec is None:
        return fn(cutlass.Float32(a), cutlass.Float32(b))
    lanes = [x.to_elements() if isinstance(x, cute.TensorSSA) else None for x in (a, b)]
    out = cute.make_rmem_tensor(vec.shape, cutlass.Float32)
    for k in range(cute.size(vec.shape)):
        out[k] = fn(*(cutlass.Float32(x) if ls is None else ls[k] for x, ls in zip((a, b), lanes)))
    return out.load()


def _typed_like(x, other):
    """A Python number in ``other``'s type (a vector's or a scalar's): the DSL takes a bare
    float as fp32, and refuses to compare it with an fp64 value."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return x
    if isinstance(other, cute.TensorSSA):
        return cute.full(other.shape, x, other.dtype)
    return type(other)(x) if isinstance(other, cutlass.Numeric) else x


def nan_maximum(a, b):
    """NaN-propagating, like torch: one ``max.NaN.f32`` per fp32 lane (a compare-and-select
    pair costs four instructions, and a long row's online softmax takes one per element)."""
    if _is_f32(a) and _is_f32(b) and not (isinstance(a, float) and isinstance(b, float)):
        return _f32_lanes(lambda x, y: cute.arch.fmax(x, y, nan=True), a, b)
    a, b = _typed_like(a, b), _typed_like(b, a)
    return cute_where(a != a, a, cute_where(a > b, a, b))


def nan_minimum(a, b):
    if _is_f32(a) and _is_f32(b) and not (isinstance(a, float) and isinstance(b, float)):
        return _f32_lanes(lambda x, y: cute.arch.fmin(x, y, nan=True), a, b)
    a, b = _typed_like(a, b), _typed_like(b, a)
    return cute_where(a != a, a, cute_where(a < b, a, b))


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
    # a number raised to a tensor's powers (an optimizer's bias correction, ``beta ** step``):
    # the DSL's pow takes vectors only
    return cute.math.pow(_typed_like(a, b), _typed_like(b, a))


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
    return cute_where((r != 0) & ((a ^ b) < 0), q + 1, q)


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
    "pow": _pow, "maximum": nan_maximum, "minimum": nan_minimum, "atan2": cute.math.atan2,
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
        return cast(args[0], out)
    if op in UNARY_MATH:
        if not out.is_floating_point and op not in ("neg", "abs"):
            raise Unsupported(f"{op} on {out}")
        cd = _compute_dtype(out)
        return cast(UNARY_MATH[op](cast(args[0], cd)), out)
    if op in BINARY_MATH:
        if op == "div" and not out.is_floating_point:
            return _trunc_div(cast(args[0], out), cast(args[1], out), out)
        cd = _compute_dtype(out)
        if op == "div" and _nonzero_number(args[1]) and not _nonzero_number(args[0]):
            return cast(cast(args[0], cd) * _reciprocal(args[1], cd), out)
        return cast(BINARY_MATH[op](cast(args[0], cd), cast(args[1], cd)), out)
    if op in COMPARE:
        tensor_dts = [d for d in arg_dtypes if isinstance(d, torch.dtype)]
        cd = tensor_dts[0]
        for d in tensor_dts[1:]:
            cd = torch.promote_types(cd, d)
        cd = _compute_dtype(cd)
        x, y = cast(args[0], cd), cast(args[1], cd)
        if cd == torch.float64:  # a number beside fp64 values: fp64 too (the DSL takes it as fp32)
            x, y = _typed_like(x, y), _typed_like(y, x)
        return COMPARE[op](x, y)
    if op in BITWISE or op == "bitwise_not":  # bool or integer operands, the output's dtype
        if out.is_floating_point:
            raise Unsupported(f"{op} on {out}")
        if op == "bitwise_not":  # no ~ on vectors: xor with all ones
            return cast(args[0], out) ^ (True if out == torch.bool else -1)
        return BITWISE[op](cast(args[0], out), cast(args[1], out))
    if op == "where":
        cd = _compute_dtype(out)
        return cast(cute_where(args[0], cast(args[1], cd), cast(args[2], cd), cd), out)
    if op == "lerp":
        cd = _compute_dtype(out)
        a, b, w = (cast(x, cd) for x in args)
        return cast(a + w * (b - a), out)
    if op == "signbit" and isinstance(arg_dtypes[0], torch.dtype) and arg_dtypes[0].is_signed \
            and not arg_dtypes[0].is_floating_point:  # a float's -0.0 and -NaN: not here
        return cast(args[0], arg_dtypes[0]) < 0
    if op == "fmod" and not out.is_floating_point:  # the remainder of the truncated quotient
        a, b = cast(args[0], out), cast(args[1], out)
        return a - _trunc_div(a, b, out) * b
    if op == "isfinite":
        a = cast(args[0], torch.float32)
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

    # exp as ex2.approx of one multiply (``fast_exp``) and reciprocal as rcp.approx, set by a
    # kernel whose stores of this evaluator's values are all fp16/bf16 (``fast_math_for``)
    fast_math = False

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
                t = cute.math.tanh(cast(self.ev(e.args[0].args[0]), torch.float32), fastmath=True)
            r = cast(t, torch.bfloat16)
        elif (narrowed := _narrowed_operation(e)) is not None:
            op, operands = narrowed
            dt = cute_dtype(e.dtype)
            x, y = packed_narrowing.as_vectors(*(cast(self.ev(a), e.dtype) for a in operands), dt)
            if op != "mul":
                r = BINARY_MATH[op](x, y)
            elif packed_narrowing.multiplies(x, y, dt):
                r = packed_narrowing.multiply(x, y, dt)
            else:  # a row scalar: in fp32
                r = cast(x, torch.float32) * cast(y, torch.float32)
            r = cast(r, e.dtype)  # rounded here, or a widening consumer would read it unrounded
        elif _is_division_by_a_softmax_sum(e):
            a, b = (cast(self.ev(x), torch.float32) for x in e.args)
            inv = 1.0 / b  # once per row value: a scalar where ``b`` is one
            q = a * inv
            r = q + (a - q * b) * inv
        elif self.fast_math and isinstance(e, Op) and e.op in _FAST and e.dtype == torch.float32:
            r = _FAST[e.op](cast(self.ev(e.args[0]), torch.float32))
        elif isinstance(e, Op):
            r = apply_op(e, [self.ev(a) for a in e.args], [dtype_of(a) for a in e.args])
        elif isinstance(e, Select):
            r = self.select(e, [functools.partial(self.branch, p) for p in e.pieces])
        else:
            raise Unsupported(f"cannot evaluate {e!r}")
        self.memo[id(e)] = r
        return r

    def branch(self, e):
        """``e``'s value computed inside a branch the kernel may not take (one piece of a
        cat/pad): what it evaluates on the way is forgotten after, since a value made in
        one branch does not exist in another or after it."""
        memo = dict(self.memo)
        try:
            return self.ev(e)
        finally:
            self.memo = memo


def fast_exp(x):
    """exp(x) in fp32 as ``ex2.approx(x * log2(e))``: two instructions where ``cute.math.exp``
    (the argument reduced in extra precision) takes nine. Its relative error is about 2**-22
    plus |x| * 2**-23 (the product's rounding): 2**-16 at x = -88, where exp underflows, and
    far below half a bf16 or fp16 ulp (2**-9, 2**-12) wherever the result is rounded to one."""
    return cute.math.exp2(x * _LOG2_E, fastmath=True)


_LOG2_E = math.log2(math.e)


def fast_reciprocal(x):
    """1 / x in fp32 as ``rcp.approx.f32``: one MUFU instruction where ``rcp.rn.f32`` takes a
    Newton step and a slow-path branch. PTX gives its error as at most one ulp over the
    whole range, subnormals included (no ``.ftz``), where the exact one rounds to half an
    ulp: 2**-23 beside a bf16 or fp16 store's 2**-9 or 2**-12. A sigmoid is ``reciprocal(1 +
    exp(-x))``. H100, bf16, forward and backward kernel us with fast math against exact:
    erf-GELU [4096, 12288] 181.7 / 188.4 (Triton 185.3); SwiGLU [4096, 8192] 177.9 / 177.1
    and tanh-GELU [4096, 10240] 141.3 / 141.5, at copy bandwidth either way."""
    if not isinstance(x, cute.TensorSSA):
        return cutlass.Float32(_rcp_approx(cutlass.Float32(x).ir_value()))
    # the DSL's vector rcp takes only ``.ftz`` (a subnormal divisor read as zero): one
    # instruction a lane, the vector rebuilt from the lanes
    lanes = [_rcp_approx(vector.extract(x, [], [i])) for i in range(cute.size(x.shape))]
    return cute.TensorSSA(vector.from_elements(ir.VectorType.get([len(lanes)], T.f32()), lanes), x.shape,
                          cutlass.Float32)


def _rcp_approx(v):
    return llvm.inline_asm(T.f32(), [v], "rcp.approx.f32 $0, $1;", "=f,f", has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


_FAST = {"exp": fast_exp, "reciprocal": fast_reciprocal}  # fp32 ops an Evaluator with fast_math approximates


def fast_math_for(store_dtypes) -> bool:
    """May a kernel whose stores have these dtypes take ``exp`` and ``reciprocal`` as
    approximations (``Evaluator.fast_math``)? Where every store rounds to fp16/bf16, an
    error of a few fp32 ulps is far below that rounding (as far below as eager's own fp32
    roundings, which the same cancellations amplify), unless ``THUNDER_FUSER_FAST_MATH=0``."""
    dts = list(store_dtypes)
    return bool(dts) and all(dt in LOW_PRECISION for dt in dts) and config.flag("THUNDER_FUSER_FAST_MATH")


def as_vector(x, V, dt):
    """``x`` as a ``(1, V)`` vector of ``dt`` (row scalars and numbers are broadcast)."""
    if isinstance(x, (bool, int, float)):
        return cute.full((1, V), x, cute_dtype(dt))
    if isinstance(x, cute.TensorSSA):
        return cast(x, dt)
    return cute.full((1, V), cast(x, dt), cute_dtype(dt))


def result_as(r, dtype):
    """A row (or column) statistic, computed in fp32, as the dtype thunder gave it."""
    return r if dtype == torch.float32 else cast(r, dtype)
