"""The programs we benchmark and print golden segmentations for, written as users write them.

Tests import these too, so a golden printout and a benchmark number describe the same code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# the tanh-gelu constants of NVIDIA/Fuser#785, passed as the four scalars
GELU_SCALARS = (0.5, 0.79788456, 0.044715, 3.0)


def gelu_bias(x, bias):
    return F.gelu(x + bias, approximate="tanh")


def gelu_bias_backward(T4, T5, T6, S0, S1, S2, S3):
    """NVIDIA/Fuser#785: the bias gradient (a sum over batch and sequence) beside the
    tanh-gelu input gradient ``T5 * gelu'(T6)``."""
    t19 = T4.sum((0, 1))
    t8 = S0 * T6
    inner = S1 * (T6 + S2 * T6**S3)
    th = torch.tanh(inner)
    left = S0 * (1 + th)
    right = t8 * (1 - th * th) * S1 * (1 + S3 * S2 * T6 * T6)
    return t19, T5 * (left + right)


def softmax(x):
    return torch.softmax(x, -1)


def rmsnorm(x, w, eps: float = 1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def rotate_half_residual(x):
    """``x + cat(-x[..., n:], x[..., :n])``: one resize kernel reads ``x`` once."""
    n = x.shape[-1] // 2
    return x + torch.cat((-x[..., n:], x[..., :n]), -1)


def rope(q, k, cos, sin):
    """Llama rotary embedding of q and k (rotate-half form), cos/sin of shape [s, d]."""

    def rot(x):
        n = x.shape[-1] // 2
        return torch.cat((-x[..., n:], x[..., :n]), -1)

    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


def adam_step(params, grads, exp_avgs, exp_avg_sqs, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2, step=3):
    """AdamW (torch.optim's single-tensor algorithm) written with in-place ops."""
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / (bc2**0.5)).add_(eps)
        p.addcdiv_(m, denom, value=-lr / bc1)
