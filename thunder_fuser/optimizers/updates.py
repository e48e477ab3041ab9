"""The updates of torch's ``Adam``/``AdamW`` and ``SGD`` as functions thunder traces: lists of
tensors in, every parameter and state tensor written in place (``copy_``, which our
functionalization makes ``copy_to_out_`` into the optimizer's own tensor).

torch's optimizers key their state by parameter, build it on the first step and read the step
count on the host; thunder's interpreter can do none of that (``thunder/issues/1055``,
``1057``). ``optimizers/jitted_step.py`` gathers the tensors and computes on the host what
torch computes there (the bias corrections, in double); these functions are what runs on the
device, one trace for all of a group's parameters.

Each follows torch 2.13's own arithmetic (CUDA's order of operations), so that a step is
torch's within the rounding of its math dtype (torch's CPU kernels fuse multiply-adds, so
bits can differ there): the single-tensor and foreach steps round every in-place op's result to the
tensor's dtype (a bf16 moment is rounded after ``mul_`` and again after ``addcmul_``), so
these round where torch does, computing in the op's math dtype (fp32 for bf16) between; the
fused step (``fused=True``) computes a whole update in fp32 and rounds each tensor once, as
torch's fused kernel does. The step-dependent numbers come in ``scalars``, 0-d tensors in the
math dtype on the parameters' device, so a changed learning rate or step count is new
data, never a new trace.
"""

from __future__ import annotations

import torch
from thunder.core.dtypes import to_torch_dtype

# scalars' slots, Adam: the decoupled decay factor (1 - lr * wd; fused: lr * wd), -lr / bias
# correction 1 (fused: lr / bias correction 1), sqrt(bias correction 2)
ADAM_DECAY, ADAM_STEP, ADAM_BC2_SQRT = 0, 1, 2
# SGD: -lr
SGD_NEG_LR = 0


def math_dtype(dtype) -> torch.dtype:
    """The dtype torch computes an op of ``dtype`` tensors in (its ``opmath`` type); ``dtype``
    torch's or, inside a trace, thunder's (which never equals torch's: an fp64 update was
    computed in fp32)."""
    if not isinstance(dtype, torch.dtype):
        dtype = to_torch_dtype(dtype)
    return torch.float64 if dtype == torch.float64 else torch.float32


def _as(t, dtype):
    """``t`` in ``dtype``; ``t`` itself where it is in it already: thunder takes a ``to`` that
    changes nothing for a view of its input, and every write after it would be guarded as
    a write through an alias (a kernel boundary at each)."""
    return t if t.dtype == dtype else t.to(dtype)


def _lerp(start, end, weight: float):
    """torch's ``lerp`` (``aten/src/ATen/native/Lerp.h``): from the nearer end."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1 - weight)


def adam(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, max_exp_avg_sqs: list, scalars,
         *, beta1: float, beta2: float, eps: float, weight_decay: float, decoupled: bool, amsgrad: bool,
         maximize: bool, fused: bool) -> None:
    """``torch.optim.Adam``'s (``decoupled``: ``AdamW``'s) update of every parameter."""
    for i, param in enumerate(params):
        if fused:
            _fused_adam(param, grads[i], exp_avgs[i], exp_avg_sqs[i], max_exp_avg_sqs[i] if amsgrad else None,
                        scalars, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, decoupled=decoupled,
                        maximize=maximize)
            continue
        dtype, op = param.dtype, math_dtype(param.dtype)
        grad = -grads[i] if maximize else grads[i]
        p = param
        if weight_decay != 0:
            if decoupled:  # param.mul_(1 - lr * wd)
                p = _as(_as(p, op) * scalars[ADAM_DECAY], dtype)
            else:  # grad.add(param, alpha=wd)
                grad = _as(_as(grad, op) + weight_decay * _as(p, op), dtype)
        g = _as(grad, op)
        m = _as(_lerp(_as(exp_avgs[i], op), g, 1 - beta1), dtype)  # exp_avg.lerp_(grad, 1 - beta1)
        v = _as(_as(exp_avg_sqs[i], op) * beta2, dtype)  # exp_avg_sq.mul_(beta2)
        v = _as(_as(v, op) + (1 - beta2) * g * g, dtype)  # .addcmul_(grad, grad, value=1 - beta2)
        # later reads go through what copy_ returns, as after torch's in-place ops: the
        # computed value is then read by its write alone, which becomes copy_to_out_
        m = exp_avgs[i].copy_(m)
        v = exp_avg_sqs[i].copy_(v)
        if amsgrad:
            v = max_exp_avg_sqs[i].copy_(torch.maximum(max_exp_avg_sqs[i], v))
        denom = _as(torch.sqrt(_as(v, op)), dtype)
        denom = _as(_as(denom, op) / scalars[ADAM_BC2_SQRT], dtype)
        denom = _as(_as(denom, op) + eps, dtype)
        # param.addcdiv_(exp_avg, denom, value=-step_size)
        param.copy_(_as(_as(p, op) + scalars[ADAM_STEP] * (_as(m, op) / _as(denom, op)), dtype))


def _fused_adam(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, scalars, *, beta1, beta2, eps, weight_decay,
                decoupled, maximize) -> None:
    """torch's fused Adam kernel (``aten/src/ATen/native/cuda/fused_adam_utils.cuh``): every
    value in the math dtype, each tensor rounded once."""
    dtype, op = param.dtype, math_dtype(param.dtype)
    p, g = _as(param, op), _as(grad, op)
    if maximize:
        g = -g
    if weight_decay != 0:
        if decoupled:
            p = p - scalars[ADAM_DECAY] * p
        else:
            g = g + p * weight_decay
    m = beta1 * _as(exp_avg, op) + (1 - beta1) * g
    v = beta2 * _as(exp_avg_sq, op) + (1 - beta2) * g * g
    exp_avg.copy_(_as(m, exp_avg.dtype))
    exp_avg_sq.copy_(_as(v, exp_avg_sq.dtype))
    if max_exp_avg_sq is not None:
        v = torch.maximum(_as(max_exp_avg_sq, op), v)
        max_exp_avg_sq.copy_(_as(v, max_exp_avg_sq.dtype))
    denom = torch.sqrt(v) / scalars[ADAM_BC2_SQRT] + eps
    param.copy_(_as(p - scalars[ADAM_STEP] * m / denom, dtype))


def sgd(params: list, grads: list, momentum_buffers: list, scalars, *, momentum: float, dampening: float,
        weight_decay: float, nesterov: bool, maximize: bool) -> None:
    """``torch.optim.SGD``'s update of every parameter (its momentum buffers already made: the
    first step, which makes them, runs as torch's own)."""
    for i, param in enumerate(params):
        dtype, op = param.dtype, math_dtype(param.dtype)
        grad = -grads[i] if maximize else grads[i]
        if weight_decay != 0:  # grad.add(param, alpha=wd)
            grad = _as(_as(grad, op) + weight_decay * _as(param, op), dtype)
        if momentum != 0:
            buf = _as(_as(momentum_buffers[i], op) * momentum, dtype)  # buf.mul_(momentum)
            buf = _as(_as(buf, op) + (1 - dampening) * _as(grad, op), dtype)  # .add_(grad, alpha=1 - dampening)
            buf = momentum_buffers[i].copy_(buf)
            if nesterov:  # grad.add(buf, alpha=momentum)
                grad = _as(_as(grad, op) + momentum * _as(buf, op), dtype)
            else:
                grad = buf
        param.copy_(_as(_as(param, op) + scalars[SGD_NEG_LR] * _as(grad, op), dtype))  # add_(grad, alpha=-lr)
