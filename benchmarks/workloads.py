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


class TransformerBlock(torch.nn.Module):
    """A pre-norm GPT block (LayerNorm, causal SDPA, GELU MLP), the shape of thunder's
    nanogpt test model (whose file the GPU wheel pack trims)."""

    def __init__(self, d: int = 1024, heads: int = 16):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
