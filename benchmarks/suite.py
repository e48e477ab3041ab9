"""The benchmark suite: each workload at a small (host-overhead-bound) and a large
(bandwidth-bound) size, with how to build its inputs and count its bytes.

``bytes`` is the floor of memory traffic: every input read once, every output (and every
tensor updated in place) written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from benchmarks import workloads as W


@dataclass
class Case:
    name: str
    size: str
    fn: Callable
    make: Callable[[], tuple]  # fresh inputs
    written: Callable[[tuple, object], list] | None = None  # tensors written (default: the outputs)
    backward: bool = False
    kind: str = "large"  # small: host-overhead-bound; large: bandwidth-bound
    executors: tuple = ()  # thunder executors the thunder contenders take before their own


def _bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def _f32(*shape):
    return torch.randn(*shape, device="cuda")


def _adam_inputs(sizes):
    p, g, m = ([_f32(s) for s in sizes] for _ in range(3))
    v = [_f32(s).abs() for s in sizes]
    return (p, g, m, v)


def _rope_inputs(b, h, kvh, s, d):
    return _bf(b, h, s, d), _bf(b, kvh, s, d), _bf(s, d), _bf(s, d)


def _block_step(block):
    def step(x):
        y = block(x)
        y.sum().backward()
        return y.detach()

    return step


def _add(out: list, kind: str, case: Case) -> None:
    case.kind = kind
    out.append(case)


def cases() -> list[Case]:
    out = []
    for size, m in (("small", 16), ("large", 8192)):
        _add(out, size, Case("gelu(x + bias) bf16", f"[{m}, 4096]", W.gelu_bias, lambda m=m: (_bf(m, 4096), _bf(4096))))
    for size, m in (("small", 16), ("large", 32768)):
        _add(out, size, Case("rmsnorm bf16", f"[{m}, 4096]", W.rmsnorm, lambda m=m: (_bf(m, 4096), _bf(4096))))
        _add(out, size, Case("layernorm bf16", f"[{m}, 4096]", W.layernorm, lambda m=m: (_bf(m, 4096), _bf(4096), _bf(4096))))
    for size, m in (("small", 16), ("large", 8192)):
        _add(out, size, Case("softmax bf16", f"[{m}, 4096]", W.softmax, lambda m=m: (_bf(m, 4096),)))
    for size, s in (("small", 16), ("large", 4096)):
        _add(out, size, Case("rotate-half + residual bf16", f"[8, 32, {s}, 128]", W.rotate_half_residual,
                        lambda s=s: (_bf(8, 32, s, 128),)))
        _add(out, size, Case("RoPE Llama-3-8B bf16", f"q[2, 32, {s}, 128] k[2, 8, {s}, 128]", W.rope,
                        lambda s=s: _rope_inputs(2, 32, 8, s, 128)))
        _add(out, size, Case("RoPE Mistral-7B bf16", f"q[1, 32, {s}, 128] k[1, 8, {s}, 128]", W.rope,
                        lambda s=s: _rope_inputs(1, 32, 8, s, 128)))
    for size, b in (("small", 1), ("large", 16)):
        n = 16 if size == "small" else 512
        _add(out, size, Case("gelu-bias backward (Fuser#785) fp32", f"[{b}, {n}, 4096]", W.gelu_bias_backward,
                        lambda b=b, n=n: (*(_f32(b, n, 4096) for _ in range(3)), *W.GELU_SCALARS)))
    for size, sizes in (("small", [4096, 1024]), ("large", [16 * 2**20] * 4)):
        label = "4 x 16M" if size == "large" else "4096 + 1024"
        _add(out, size, Case("AdamW step in place fp32", label, W.adam_step, lambda sizes=sizes: _adam_inputs(sizes),
                        written=lambda args, result: args[0] + args[2] + args[3]))
    for size, (b, s) in (("small", (1, 64)), ("large", (8, 1024))):
        _add(out, size, Case("transformer block fwd+bwd bf16", f"[{b}, {s}, 1024]", None,
                        lambda b=b, s=s: (_bf(b, s, 1024).requires_grad_(),), backward=True))
    # as a user runs a transformer: thunder's sdpa executor takes the attention (flash or
    # cuDNN), which thunder decomposes into matmuls and a softmax without it
    _add(out, "large", Case("transformer block fwd+bwd bf16, with sdpa_ex", "[8, 1024, 1024]", None,
                            lambda: (_bf(8, 1024, 1024).requires_grad_(),), backward=True, executors=("sdpa",)))
    return out


def nbytes(case: Case, args, result) -> int:
    tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
    written = case.written(args, result) if case.written else [r for r in _flat(result) if isinstance(r, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors + list(written))


def _flat(x):
    if isinstance(x, (tuple, list)):
        for y in x:
            yield from _flat(y)
    else:
        yield x
