"""Packed bf16 roundings on and off, alternately in one process (dev aid; GPU machine):
device ms of thunder+fuser on the large bf16 pointwise workloads, with
``packed_narrowing`` and ``cute_emit._narrowed_operation`` as they are ("packed") and
disabled ("llvm": LLVM's own lowering of each rounding), three rounds each, fresh kernel
caches per variant, beside torch.compile measured once. (The transformer block's effect is
read per kernel with ``scripts/block_kernels.py`` and in the suite.)"""
import os
import tempfile

import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.suite import cases
from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
from thunder_fuser.kernels import cache, cute_emit, packed_narrowing

NAMES = ("gelu(x + bias) bf16", "RoPE Llama-3-8B bf16", "RoPE Mistral-7B bf16", "rotate-half + residual bf16")
PACKS, NARROWED = packed_narrowing.packs, cute_emit._narrowed_operation


def _variant(packed: bool) -> None:
    packed_narrowing.packs = PACKS if packed else (lambda *a: False)
    cute_emit._narrowed_operation = NARROWED if packed else (lambda e: None)
    os.environ["THUNDER_FUSER_CACHE"] = tempfile.mkdtemp()
    cache.clear_memory()


def main():
    chosen = [c for c in cases() if c.kind == "large" and c.name in NAMES]
    rows = {c.name: [] for c in chosen}
    inputs = {c.name: c.make() for c in chosen}  # all random inputs before any graph capture
    for c in chosen:
        args = inputs[c.name]
        rows[c.name].append(f"compile {device_ms(torch.compile(c.fn), [args])[0]:.4f}")
    for _ in range(3):
        for packed in (True, False):
            _variant(packed)
            tag = "packed" if packed else "llvm"
            for c in chosen:
                args = inputs[c.name]
                f = thunder.jit(c.fn, executors=[fuser_ex])
                f(*args)
                rows[c.name].append(f"{tag} {device_ms(f, [args])[0]:.4f}")
    for name, r in rows.items():
        print(f"{name:30s} " + "  ".join(r))


if __name__ == "__main__":
    main()
