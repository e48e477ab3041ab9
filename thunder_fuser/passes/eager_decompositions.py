"""Decompositions that compute what torch computes, where thunder's do not.

We run the prims an op decomposes into, so an op whose thunder decomposition differs from
torch's kernel on some inputs differs in our hands too (thunder's torch executor calls the
torch op instead and hides it). Each rule here is written in thunder's torch-level ops; those
of ``RULES`` replace the op's subsymbols before regions are claimed, anywhere in the trace:

* ``relu``: thunder's ``where(a > 0, a, 0)`` turns NaN into 0; torch's keeps NaN, as does
  ``maximum(a, 0)``. thunder's autodiff decomposes it before any trace pass sees the
  forward, so relu is an op we claim with rules of our own (``register``: its execution
  rule serves inference too), whose backward passes the cotangent where the *result* is
  not ``<= 0``, NaN included, as torch's ``threshold_backward``;
* ``log_softmax``: thunder's ``a - logsumexp(a)`` drops an infinite max from the shift
  (``log_softmax([inf, 1, -2])`` gives ``[nan, -inf, -inf]``); torch shifts by the max as
  it is, ``(a - max) - log(sum(exp(a - max)))``, so such a row is NaN throughout;
* ``softmax``, ``log_softmax``, ``layer_norm``: torch's kernels return a contiguous result
  whatever the input's layout (a channels-last input included), where the decomposition's
  last elementwise op would follow the input's: their results are tagged ``CONTIGUOUS``;
* ``add`` and ``sub`` with ``alpha``: thunder scales the second operand in its own dtype,
  before promotion (a bf16 ``b * alpha``, rounded, then added to fp32 ``a``); torch computes
  ``a + alpha * b`` in the promoted computation dtype and rounds once (reading ``alpha`` in
  the result's dtype on the CPU, in the computation dtype on CUDA);
* ``pow`` of a number to a tensor's powers: torch reads the number in the result's dtype
  (``pow(0.9, x)`` of a bf16 ``x`` raises bf16's 0.8984375), thunder in fp32; and torch's
  result is contiguous whatever the exponent's layout (its meta function gives no strides);
* ``gelu`` and ``silu`` (claimed as relu, ``register``) and the ``ROUNDED_ONCE`` activations
  of 16-bit floats (softplus, mish, ...): thunder's decomposition rounds each step to 16
  bits; torch computes in fp32 and rounds once, in its own formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import thunder.torch as ltorch
import torch
from thunder.core import dtypes, prims, utils
from thunder.core.prims import get_grad, put_grad
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, tracectx

from thunder_fuser.ir.from_thunder import CONTIGUOUS, CONVERSION_OPS, MATERIALIZED, MATERIALIZED_FIRST


def _relu(a, inplace=False):
    return ltorch.maximum(a, 0.0 if dtypes.is_inexact_dtype(a.dtype) else 0)


def _relu_grad(a, inplace=False):
    out = _relu(a)
    put_grad(a, ltorch.where(ltorch.le(out, 0), 0, get_grad(out)))
    return out


def _tensor_on_a_device(a, inplace=False) -> bool:
    return isinstance(a, TensorProxy) and a.device.type in ("cpu", "cuda") and dtypes.is_inexact_dtype(a.dtype)


def _opmath(a):
    """The dtype torch's elementwise kernels compute ``a``'s dtype in."""
    return dtypes.float32 if dtypes.is_low_precision_dtype(a.dtype) else a.dtype


def _gelu_math(x, approximate):
    """torch's gelu, in ``x``'s dtype (written out in elementwise ops: calling ``ltorch.gelu``
    here would be our claimed symbol again)."""
    if approximate == "tanh":
        return 0.5 * x * (1.0 + ltorch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))
    return x * 0.5 * (1.0 + ltorch.erf(x * (1.0 / math.sqrt(2.0))))


def _gelu_once(a, /, *, approximate="none"):
    return ltorch.to(_gelu_math(ltorch.to(a, _opmath(a)), approximate), a.dtype)


def _gelu_grad(a, /, *, approximate="none"):
    """torch's ``gelu_backward``: from the input and cotangent in the compute dtype, rounded once.
    Its signature is ``ltorch.gelu``'s: thunder's vjp pairs the symbol's positional
    parameters with the grad transform's (ThunderFX's splitter failed on every gelu else)."""
    out = _gelu_once(a, approximate=approximate)
    x, g = ltorch.to(a, _opmath(a)), ltorch.to(get_grad(out), _opmath(a))
    if approximate == "tanh":
        beta, kappa = math.sqrt(2.0 / math.pi), 0.044715
        x_sq = x * x
        inner = ltorch.tanh(beta * (x + kappa * x_sq * x))
        slope = 0.5 * (1.0 + inner) + 0.5 * x * (1.0 - inner * inner) * beta * (1.0 + 3.0 * kappa * x_sq)
    else:
        cdf = 0.5 * (1.0 + ltorch.erf(x * (1.0 / math.sqrt(2.0))))
        slope = cdf + x * ltorch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
    put_grad(a, ltorch.to(g * slope, a.dtype))
    return out


def _silu_once(a, inplace=False):
    x = ltorch.to(a, _opmath(a))
    return ltorch.to(x * ltorch.sigmoid(x), a.dtype)


def _silu_grad(a, inplace=False):
    """torch's ``silu_backward``: in the compute dtype, rounded once."""
    out = _silu_once(a)
    x, g = ltorch.to(a, _opmath(a)), ltorch.to(get_grad(out), _opmath(a))
    sig = ltorch.sigmoid(x)
    put_grad(a, ltorch.to(g * sig * (1.0 + x * (1.0 - sig)), a.dtype))
    return out


def _float_on_a_device(a, *args, inplace=False, **kwargs) -> bool:
    return (isinstance(a, TensorProxy) and a.device.type in ("cpu", "cuda") and not inplace
            and dtypes.is_float_dtype(a.dtype))


def register(executor) -> frozenset:
    """Claim the ops whose rule holds in training too (their forward and backward); their
    ids. thunder's autodiff decomposes an op before any trace pass sees the forward, so an
    op whose backward must round as torch's does is one we claim: relu, and gelu and silu,
    computed as torch computes them (thunder's forward and backward of a 16-bit one rounded
    each step: a bf16 gradient had half its elements an ulp away from eager's)."""
    executor.register_supported(ltorch.relu, _tensor_on_a_device, execution_transform=_relu, grad_transform=_relu_grad)
    executor.register_supported(ltorch.gelu, _float_on_a_device, execution_transform=_gelu_once,
                                grad_transform=_gelu_grad)
    executor.register_supported(ltorch.silu, _float_on_a_device, execution_transform=_silu_once,
                                grad_transform=_silu_grad)
    return frozenset((ltorch.relu.id, ltorch.gelu.id, ltorch.silu.id))


def _log_softmax(a, dim, *, dtype=None):
    result_dtype = dtypes.to_dtype(dtype or a.dtype)
    x = ltorch.to(a, utils.get_computation_dtype(result_dtype))
    shifted = ltorch.sub(x, ltorch.amax(x, dim, keepdim=True))
    out = ltorch.sub(shifted, ltorch.log(ltorch.sum(ltorch.exp(shifted), dim, keepdim=True)))
    return ltorch.to(out, result_dtype)


def _scaled(op):
    def rule(a, b, *, alpha=1):
        computation, result = utils.elementwise_type_promotion(
            a, b, type_promotion_kind=utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        a_ = ltorch.to(a, computation) if isinstance(a, TensorProxy) else a
        b_ = ltorch.mul(ltorch.to(b, computation), _alpha_as_torch_reads_it(alpha, result, b.device))
        return ltorch.to(op(a_, b_), result)

    return rule


def _alpha_as_torch_reads_it(alpha, result_dtype, device):
    """torch's CPU kernel reads ``alpha`` in the result's dtype (a bf16 add rounds 0.3 to bf16
    first); its CUDA kernel in the computation dtype (fp32)."""
    if isinstance(alpha, (int, float)) and device.type == "cpu" and dtypes.is_low_precision_dtype(result_dtype):
        return float(torch.tensor(alpha, dtype=dtypes.to_torch_dtype(result_dtype)))
    return alpha


def _alpha_scales_a_tensor(bsym: BoundSymbol) -> bool:
    alpha = bsym.kwargs.get("alpha", 1)
    return (len(bsym.args) == 2 and isinstance(bsym.args[1], TensorProxy)
            and (isinstance(alpha, TensorProxy) or alpha != 1))


def _number_base(bsym: BoundSymbol) -> bool:
    return len(bsym.args) == 2 and isinstance(bsym.args[0], (int, float)) and isinstance(bsym.args[1], TensorProxy)


def _number_base_rounded(bsym: BoundSymbol) -> bool:
    """A number base that the result's 16-bit dtype does not hold exactly."""
    if not _number_base(bsym) or not isinstance(bsym.output, TensorProxy):
        return False
    result = bsym.output.dtype
    return (dtypes.is_low_precision_dtype(result) and dtypes.is_float_dtype(result)
            and float(torch.tensor(bsym.args[0], dtype=dtypes.to_torch_dtype(result))) != bsym.args[0])


def _pow_of_a_number(base, exp):
    """``pow(base, exp)`` with ``base`` read in the result's dtype, as torch reads it."""
    _, result = utils.elementwise_type_promotion(base, exp, type_promotion_kind=utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return ltorch.pow(float(torch.tensor(base, dtype=dtypes.to_torch_dtype(result))), exp)


def _rounded_once(op):
    """``op`` of a 16-bit float computed in fp32 and rounded once, as torch's kernel does."""
    def rule(a, *args, **kwargs):
        return ltorch.to(op(ltorch.to(a, dtypes.float32), *args, **kwargs), a.dtype)

    return rule


def _of_16_bit_floats(bsym: BoundSymbol) -> bool:
    a = bsym.args[0] if bsym.args else None
    return isinstance(a, TensorProxy) and dtypes.is_low_precision_dtype(a.dtype) and dtypes.is_float_dtype(a.dtype)


# activations whose thunder decomposition is several torch-level ops, each rounding a 16-bit
# input's intermediate to 16 bits, where torch's kernel rounds once: bf16 gelu, silu, mish and
# hardswish differed from eager's in 27-39% of elements (an ulp), softplus, logsigmoid, selu
# and hardsigmoid in 15-19%
# (gelu and silu are ops we claim: ``register``)
ROUNDED_ONCE = (ltorch.softplus, ltorch.mish, ltorch.hardswish, ltorch.hardsigmoid, ltorch.logsigmoid, ltorch.selu)

# symbol id -> (does the rule apply to this call, the rule)
RULES: dict[str, tuple[Callable[[BoundSymbol], bool], Callable]] = {
    ltorch.log_softmax.id: (lambda b: isinstance(b.args[0], TensorProxy), _log_softmax),
    ltorch.add.id: (_alpha_scales_a_tensor, _scaled(ltorch.add)),
    ltorch.sub.id: (_alpha_scales_a_tensor, _scaled(ltorch.sub)),
    ltorch.pow.id: (_number_base_rounded, _pow_of_a_number),
    **{op.id: (_of_16_bit_floats, _rounded_once(op)) for op in ROUNDED_ONCE},
}


# ops whose torch kernel returns a contiguous result whatever its input's layout (symbol id ->
# does this call): their result's proxy is tagged, and a region lays out the value so
# (``ir/from_thunder.py``)
CONTIGUOUS_RESULTS = {ltorch._softmax.id: lambda b: True, ltorch.log_softmax.id: lambda b: True,
                      ltorch.layer_norm.id: lambda b: True, ltorch.pow.id: _number_base}


def _tag_contiguous_results(bsyms) -> None:
    for b in bsyms:
        if b.sym.id in CONTIGUOUS_RESULTS and isinstance(b.output, TensorProxy) and CONTIGUOUS_RESULTS[b.sym.id](b):
            b.output.tags.add(CONTIGUOUS)
        _tag_contiguous_results(b.subsymbols)


# torch's binary and ternary elementwise ops: on the CPU their TensorIterator converts an
# operand of another dtype than the common one by ``.to()`` first, before it broadcasts it (on
# CUDA the kernel converts as it reads), so the conversion has ``.to()``'s layout (a tensor
# that is not dense comes out dense: an expanded bf16 plus a permuted fp32 is contiguous)
PROMOTING_OPS = frozenset((
    "add", "sub", "mul", "div", "true_divide", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "where",
    "pow", "atan2", "fmod", "remainder", "lerp", "addcmul", "addcdiv", "copysign", "hypot", "logaddexp",
))


def _tag_materialized_conversions(bsyms) -> None:
    """Tag the conversions torch makes as a tensor of its own, by ``.to()``: a program's
    ``x.to(dtype)`` (``x.float()``, ...) and, on the CPU, a mixed-dtype op's operand
    conversions (of the operand or of thunder's broadcast of it: torch converts first).
    Any other conversion (a 16-bit op's upcast, a CUDA kernel's) torch makes as it reads."""
    for b in bsyms:
        tensors = [a for a in b.flat_proxy_args if isinstance(a, TensorProxy) and a.ndim]
        name = b.sym.name.rsplit(".", 1)[-1]
        cpu_promotion = name in PROMOTING_OPS and len({t.dtype for t in tensors}) > 1 and (
            isinstance(b.output, TensorProxy) and b.output.device.type == "cpu")
        if isinstance(b.output, TensorProxy) and (name in CONVERSION_OPS or cpu_promotion):
            _tag_conversions_of(b.subsymbols, {t.name for t in tensors}, set())
        else:
            _tag_materialized_conversions(b.subsymbols)


def _tag_conversions_of(bsyms, names: set[str], broadcasts: set[str]) -> None:
    """Tag the conversions of ``names`` in ``bsyms`` (at any depth), and of ``bsyms``' own
    broadcasts of them (``broadcasts``), which torch converts first."""
    for b in _flat(bsyms):
        a = b.args[0] if b.args else None
        if not (isinstance(a, TensorProxy) and a.name in names | broadcasts and isinstance(b.output, TensorProxy)):
            continue
        if b.sym.id == prims.PrimIDs.CONVERT_ELEMENT_TYPE:
            b.output.tags.add(MATERIALIZED_FIRST if a.name in broadcasts else MATERIALIZED)
        elif b.sym.id == prims.PrimIDs.BROADCAST_IN_DIM:
            broadcasts.add(b.output.name)


def _flat(bsyms):
    """``bsyms``' prims in order, their subsymbols' in place of any that has some."""
    for b in bsyms:
        if b.subsymbols:
            yield from _flat(b.subsymbols)
        else:
            yield b


def _applies(bsym: BoundSymbol) -> bool:
    rule = RULES.get(bsym.sym.id)
    return rule is not None and rule[0](bsym)


def _needs(bsyms) -> bool:
    return any(_applies(b) or _needs(b.subsymbols) for b in bsyms)


def _recorded(trace: TraceCtx, bsym: BoundSymbol) -> list[BoundSymbol]:
    """The rule's ops for ``bsym``, their last output renamed to ``bsym``'s."""
    trace.push_scope([])
    try:
        out = RULES[bsym.sym.id][1](*bsym.args, **bsym.kwargs)
    finally:
        scope = trace.pop_scope()
    swap = {variableify(out): bsym.output}
    return [_computing(s).from_bsym_swap_proxies(swap) for s in scope if s.flat_proxy_outs]


def _computing(bsym: BoundSymbol) -> BoundSymbol:
    """``bsym`` without the subsymbols, at any depth, that compute no tensor (a conversion of
    a Python number made while tracing: ``hardswish``'s ``3``)."""
    if not bsym.subsymbols:
        return bsym
    return bsym.from_bsym(subsymbols=[_computing(s) for s in bsym.subsymbols if s.flat_proxy_outs])


def _rewritten(trace: TraceCtx, bsym: BoundSymbol) -> BoundSymbol:
    if _applies(bsym) and isinstance(bsym.output, TensorProxy):
        return bsym.from_bsym(subsymbols=_recorded(trace, bsym))
    if bsym.subsymbols and _needs(bsym.subsymbols):
        return bsym.from_bsym(subsymbols=[_rewritten(trace, s) for s in bsym.subsymbols])
    return bsym


def eager_decompositions(trace: TraceCtx) -> TraceCtx:
    """``trace`` with the ops of ``RULES`` decomposed as torch computes them (itself where
    none occurs). New intermediates are named in ``trace``'s namespace. The results of
    ``CONTIGUOUS_RESULTS`` are tagged."""
    _tag_contiguous_results(trace.bound_symbols)
    _tag_materialized_conversions(trace.bound_symbols)
    if not _needs(trace.bound_symbols):
        return trace
    out = from_trace(trace)
    with tracectx(out):
        out.bound_symbols = [_rewritten(out, b) for b in trace.bound_symbols]
    return out
