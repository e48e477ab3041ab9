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
  the result's dtype on the CPU, in the computation dtype on CUDA).
"""

from __future__ import annotations

from collections.abc import Callable

import thunder.torch as ltorch
import torch
from thunder.core import dtypes, utils
from thunder.core.prims import get_grad, put_grad
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.trace import TraceCtx, from_trace, tracectx

from thunder_fuser.ir.from_thunder import CONTIGUOUS


def _relu(a, inplace=False):
    return ltorch.maximum(a, 0.0 if dtypes.is_inexact_dtype(a.dtype) else 0)


def _relu_grad(a, inplace=False):
    out = _relu(a)
    put_grad(a, ltorch.where(ltorch.le(out, 0), 0, get_grad(out)))
    return out


def _tensor_on_a_device(a, inplace=False) -> bool:
    return isinstance(a, TensorProxy) and a.device.type in ("cpu", "cuda") and dtypes.is_inexact_dtype(a.dtype)


def register(executor) -> frozenset:
    """Claim the ops whose rule holds in training too (their forward and backward); their ids."""
    executor.register_supported(ltorch.relu, _tensor_on_a_device, execution_transform=_relu, grad_transform=_relu_grad)
    return frozenset((ltorch.relu.id,))


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


# symbol id -> (does the rule apply to this call, the rule)
RULES: dict[str, tuple[Callable[[BoundSymbol], bool], Callable]] = {
    ltorch.log_softmax.id: (lambda b: isinstance(b.args[0], TensorProxy), _log_softmax),
    ltorch.add.id: (_alpha_scales_a_tensor, _scaled(ltorch.add)),
    ltorch.sub.id: (_alpha_scales_a_tensor, _scaled(ltorch.sub)),
}


# ops whose torch kernel returns a contiguous result whatever its input's layout: their
# result's proxy is tagged, and a region lays out the value so (``ir/from_thunder.py``)
CONTIGUOUS_RESULTS = frozenset((ltorch._softmax.id, ltorch.log_softmax.id, ltorch.layer_norm.id))


def _tag_contiguous_results(bsyms) -> None:
    for b in bsyms:
        if b.sym.id in CONTIGUOUS_RESULTS and isinstance(b.output, TensorProxy):
            b.output.tags.add(CONTIGUOUS)
        _tag_contiguous_results(b.subsymbols)


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
    # a conversion of a Python number made while tracing computes no tensor
    return [s.from_bsym_swap_proxies(swap) for s in scope if s.flat_proxy_outs]


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
    if not _needs(trace.bound_symbols):
        return trace
    out = from_trace(trace)
    with tracectx(out):
        out.bound_symbols = [_rewritten(out, b) for b in trace.bound_symbols]
    return out
