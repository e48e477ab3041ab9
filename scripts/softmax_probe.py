"""The attention softmax of the transformer block alone (dev aid; run on the GPU machine):
rows of 1024 bf16 scores [8, 16, 1024, 1024], softmax in fp32, with and without the causal
mask thunder's SDPA decomposition builds from two iotas; thunder+fuser against eager and
torch.compile, device time from CUDA graphs, TB/s over the bytes read and written once.
With ``--ncu`` it runs only the fuser's causal kernel (for Nsight Compute)."""
import sys

import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex


def causal_softmax(s):
    n = s.shape[-1]
    i = torch.arange(n, device=s.device)
    return torch.softmax(torch.where(i[:, None] >= i[None, :], s, float("-inf")).float(), -1).to(s.dtype)


def plain_softmax(s):
    return torch.softmax(s.float(), -1).to(s.dtype)


def main():
    s = torch.randn(8, 16, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    if "--ncu" in sys.argv:
        j = thunder.jit(causal_softmax, executors=[fuser_ex])
        for _ in range(4):
            j(s)
        torch.cuda.synchronize()
        return
    nbytes = 2 * s.numel() * s.element_size()
    print(f"{'workload':16s} {'contender':14s} {'ms':>8s} {'TB/s':>6s}")
    for fn in (causal_softmax, plain_softmax):
        want = fn(s)
        for name, f in (("eager", fn), ("torch.compile", torch.compile(fn)),
                        ("thunder+fuser", thunder.jit(fn, executors=[fuser_ex]))):
            torch.testing.assert_close(f(s), want, atol=2e-2, rtol=2e-2)
            ms, _ = device_ms(f, [(s,)])
            print(f"{fn.__name__:16s} {name:14s} {ms:8.4f} {nbytes / ms / 1e9:6.2f}")


if __name__ == "__main__":
    main()
