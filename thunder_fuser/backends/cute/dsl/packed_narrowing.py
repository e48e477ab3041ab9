"""bf16 and fp16 arithmetic on pairs of lanes: narrowing fp32 vectors, and rounded products.

thunder's traces round every intermediate of a bf16 program: ``convert_element_type(x,
bfloat16)`` then back to fp32, a dozen times per element in a GELU backward. LLVM lowers a
vector ``fptrunc`` to the packed ``cvt.rn.bf16x2.f32`` only while nothing extracts single
lanes; a rounding whose result is widened again straight away is scalarized into one
``cvt.rn.bf16.f32`` per element. On sm_90 those conversions share a quarter-rate pipe with
the transcendental unit, so a bf16 GELU backward was bound by them (ncu: SM 92%, 157 us on
the GPT block's MLP). The packed instruction rounds two lanes at once, to the same values
(round to nearest even, NaN stays NaN); inline PTX keeps LLVM from splitting it again.

A product computed in bf16 itself (``cute_values._narrowed_operation``) is written
``fma.rn.bf16x2 d, a, b, -0.0``: a plain ``mul`` has no rounding modifier, so ptxas may fuse
it into the add that follows, rounding once where eager rounds the product first
(``mul.rn.bf16x2`` would pin it too, but needs sm_90; the fma runs on sm_80 as well, and
adding -0.0 keeps every product, the sign of a zero included).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass._mlir import ir
from cutlass._mlir.dialects import arith, llvm, vector
from cutlass.cutlass_dsl import T

_PACKED_CVT = {cutlass.BFloat16: "cvt.rn.bf16x2.f32 $0, $1, $2;", cutlass.Float16: "cvt.rn.f16x2.f32 $0, $1, $2;"}
_PACKED_MUL = {cutlass.BFloat16: "fma.rn.bf16x2 $0, $1, $2, $3;", cutlass.Float16: "fma.rn.f16x2 $0, $1, $2, $3;"}
_NEGATIVE_ZEROS = -0x7FFF8000  # 0x80008000: -0.0 in both 16-bit halves, as a signed 32-bit word


def _pairs(x) -> bool:
    return isinstance(x, cute.TensorSSA) and cute.size(x.shape) % 2 == 0


def packs(x, dtype) -> bool:
    """Whether ``narrow`` applies: an fp32 vector of an even number of lanes, to bf16 or fp16."""
    return _pairs(x) and x.dtype is cutlass.Float32 and dtype in _PACKED_CVT


def _asm(ptx: str, constraints: str, operands):
    return llvm.inline_asm(T.i32(), operands, ptx, constraints, has_side_effects=False,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _from_words(words, shape, dtype) -> cute.TensorSSA:
    n = 2 * len(words)
    packed = vector.from_elements(ir.VectorType.get([n // 2], T.i32()), words)
    return cute.TensorSSA(llvm.bitcast(ir.VectorType.get([n], dtype.mlir_type), packed), shape, dtype)


def _words(x: cute.TensorSSA) -> list:
    n = cute.size(x.shape)
    packed = llvm.bitcast(ir.VectorType.get([n // 2], T.i32()), x)
    return [vector.extract(packed, [], [i]) for i in range(n // 2)]


def narrow(x: cute.TensorSSA, dtype) -> cute.TensorSSA:
    """``x.to(dtype)`` with one packed conversion per pair of lanes (lane 0 in the low half,
    as a vector of two 16-bit values lays them out)."""
    lanes = [vector.extract(x, [], [i]) for i in range(cute.size(x.shape))]
    words = [_asm(_PACKED_CVT[dtype], "=r,f,f", [hi, lo]) for lo, hi in zip(lanes[::2], lanes[1::2])]
    return _from_words(words, x.shape, dtype)


def as_vectors(a, b, dtype) -> tuple:
    """``a`` and ``b`` with a Python number beside a ``dtype`` vector made a vector of it
    (the DSL would compute a vector and a number in fp32)."""
    like = b if isinstance(a, (int, float)) else a
    if not (isinstance(like, cute.TensorSSA) and like.dtype is dtype):
        return a, b
    return tuple(cute.full_like(like, x, dtype) if isinstance(x, (int, float)) else x for x in (a, b))


def multiplies(a, b, dtype) -> bool:
    """Whether ``multiply`` applies: two bf16 or fp16 vectors of an even number of lanes."""
    return dtype in _PACKED_MUL and all(_pairs(x) and x.dtype is dtype for x in (a, b))


def multiply(a, b, dtype) -> cute.TensorSSA:
    """``a * b`` rounded per lane (``fma.rn`` with -0.0), two lanes per instruction."""
    zeros = arith.constant(T.i32(), _NEGATIVE_ZEROS)
    words = [_asm(_PACKED_MUL[dtype], "=r,r,r,r", [x, y, zeros]) for x, y in zip(_words(a), _words(b))]
    return _from_words(words, a.shape, dtype)
