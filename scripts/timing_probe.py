"""How much of a short workload's measured time is launch latency (dev aid; GPU machine).

Times the same CUDA graphs three ways: one replay between events after a sync (the GPU
idles at the start event until the launch arrives: the suite's method before session 12),
replays queued back to back with an event pair each (``device_ms(queued=True)``), and 20
replays between one event pair (pure throughput). Rows: copies of several sizes and the
large bandwidth-bound workloads under eager, torch.compile and thunder+fuser."""
import statistics

import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.suite import cases, nbytes
from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex

NAMES = ("gelu(x + bias) bf16", "RoPE Llama-3-8B bf16", "RoPE Mistral-7B bf16", "rotate-half + residual bf16",
         "softmax bf16", "rmsnorm bf16")


def _batched_ms(fn, args, n=20, reps=10):
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args)
    g.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            g.replay()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) / n)
    return statistics.median(out)


def _three(fn, args, nbytes_):
    one = device_ms(fn, [args], queued=False)[0]
    queued = device_ms(fn, [args], queued=True)[0]
    batched = _batched_ms(fn, args)
    return [nbytes_ / ms / 1e9 for ms in (one, queued, batched)]


def main():
    rows = []
    for mib in (41, 81, 256, 1024):
        a = torch.randn(mib * 2**20 // 4, device="cuda")
        b = torch.empty_like(a)
        rows.append((f"copy {mib} MiB", "", *_three(lambda: b.copy_(a), (), 2 * a.numel() * 4)))
        del a, b
    for c in cases():
        if c.kind != "large" or c.name not in NAMES:
            continue
        args = c.make()
        n = nbytes(c, args, c.fn(*args))
        for kind, f in (("eager", c.fn), ("torch.compile", torch.compile(c.fn)),
                        ("thunder+fuser", thunder.jit(c.fn, executors=[fuser_ex]))):
            f(*args)
            rows.append((c.name, kind, *_three(f, args, n)))
    print(f"{'workload':30s} {'contender':14s} {'one replay':>10s} {'queued':>8s} {'20 in a row':>11s}  (TB/s)")
    for name, kind, *tb in rows:
        print(f"{name:30s} {kind:14s} {tb[0]:10.2f} {tb[1]:8.2f} {tb[2]:11.2f}")


if __name__ == "__main__":
    main()
