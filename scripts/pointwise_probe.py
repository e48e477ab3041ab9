"""Pointwise kernels at several block sizes and rows per thread along a broadcast mode, on the
large bandwidth-bound workloads (dev aid; run on the GPU machine): TB/s of thunder+fuser and
of torch.compile, beside the copy. Arguments: workload names ('; '-separated) and
configurations ('threads,rows;...')."""
import os
import sys
import tempfile

import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.suite import cases, nbytes
from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
from thunder_fuser.kernels import cache, cute_emit, geometry

NAMES = sys.argv[1].split(";") if len(sys.argv) > 1 else [
    "gelu(x + bias) bf16", "RoPE Llama-3-8B bf16", "RoPE Mistral-7B bf16", "rotate-half + residual bf16", "softmax bf16"]


def main():
    big = torch.randn(256 * 2**20 // 4, device="cuda")
    out = torch.empty_like(big)
    ms, _ = device_ms(lambda: out.copy_(big), [()])
    copy = 2 * big.numel() * 4 / ms / 1e9
    print(f"copy {copy:.2f} TB/s")
    chosen = [c for c in cases() if c.kind == "large" and c.name in NAMES]
    rows = {}
    for c in chosen:
        args = c.make()
        n = nbytes(c, args, c.fn(*args))
        ms, _ = device_ms(torch.compile(c.fn), [args])
        rows[c.name] = [f"compile {n / ms / 1e9:.2f}"]
    configs = [tuple(map(int, c.split(","))) for c in sys.argv[2].split(";")] if len(sys.argv) > 2 else [
        (128, 1), (128, 2), (128, 4), (128, 8), (256, 4)]
    for threads, reuse in configs:
        cute_emit.POINTWISE_THREADS, geometry.REUSE_ROWS = threads, reuse
        os.environ["THUNDER_FUSER_CACHE"] = tempfile.mkdtemp()
        cache.clear_memory()
        for c in chosen:
            args = c.make()
            f = thunder.jit(c.fn, executors=[fuser_ex])
            n = nbytes(c, args, f(*args))
            ms, _ = device_ms(f, [args])
            rows[c.name].append(f"T={threads},R={reuse} {n / ms / 1e9:.2f}")
    for name, r in rows.items():
        print(f"{name:32s} " + "  ".join(r))


if __name__ == "__main__":
    main()
