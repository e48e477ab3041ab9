"""What a division by a constant costs in a kernel (dev aid; GPU machine): the exact GELU
and its input gradient as thunder decomposes them (x / sqrt(2), twice in the gradient),
[8192, 4096] fp32 and bf16, thunder+fuser with the division kept (``div.rn.f32``) and as
a multiply by the fp32 reciprocal (eager's own rule), beside eager and torch.compile.
Prints ms and TB/s over bytes read and written once; each result is checked against eager."""
import os
import tempfile

import thunder_fuser  # noqa: F401
import thunder
import torch
import torch.nn.functional as F

from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
from thunder_fuser.kernels import cache, cute_emit


def gelu_grad(x, g):
    """d gelu(x) / dx * g, written as thunder's decomposition computes it."""
    t = x / 1.4142135623730951
    return g * (0.5 + 0.5 * torch.erf(t)) + x * g * 0.5 * 1.1283791670955126 * torch.exp(-t * t) / 1.4142135623730951


def main():
    keep = cute_emit._nonzero_number
    print(f"{'case':22s} {'eager':>8s} {'compile':>8s} {'divide':>8s} {'reciprocal':>10s}  (ms; TB/s of the last)")
    for dtype in (torch.float32, torch.bfloat16):
        x, g = (torch.randn(8192, 4096, device="cuda", dtype=dtype) for _ in range(2))
        for name, fn, args in (("gelu", F.gelu, (x,)), ("gelu input gradient", gelu_grad, (x, g))):
            row = [device_ms(fn, [args])[0], device_ms(torch.compile(fn), [args])[0]]
            for rule in (lambda c: False, keep):
                cute_emit._nonzero_number = rule
                os.environ["THUNDER_FUSER_CACHE"] = tempfile.mkdtemp()  # the rule is not in the compile key
                cache.clear_memory()
                j = thunder.jit(fn, executors=[fuser_ex])
                torch.testing.assert_close(j(*args), fn(*args), atol=2e-2, rtol=2e-2)
                row.append(device_ms(j, [args])[0])
            cute_emit._nonzero_number = keep
            nbytes = (len(args) + 1) * x.numel() * x.element_size()
            label = f"{name} {str(dtype)[6:]}"
            print(f"{label:22s}" + "".join(f" {ms:8.4f}" for ms in row[:3]) + f" {row[3]:10.4f}  {nbytes / row[3] / 1e9:.2f}")


if __name__ == "__main__":
    main()
