"""Where the transformer block's fwd+bwd time goes, per contender (dev aid; run on the GPU
machine): the GPU kernels of a few steps under torch.profiler, grouped by name, and for
thunder+fuser each fuser region's GPU time (CUDA events around its calls) with the kind of
each segment and whether it ran a kernel. Usage: python scripts/block_profile.py [b s]."""
import copy
import sys
from collections import defaultdict

import thunder_fuser  # noqa: F401
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.run import _block_contender
from benchmarks.workloads import TransformerBlock
from thunder_fuser.runtime.region_runner import RegionRunner

STEPS = 3


def kernel_table(step, x, top=18):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step(x)
        torch.cuda.synchronize()
    rows = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            r = rows[e.name[:90]]
            r[0] += 1
            r[1] += e.device_time
    total = sum(r[1] for r in rows.values()) / STEPS / 1e3
    print(f"  GPU kernel time per step: {total:.3f} ms, {sum(r[0] for r in rows.values()) // STEPS} kernels")
    for name, (n, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {us / STEPS / 1e3:8.3f} ms {n // STEPS:4d}x  {name}")


def region_table(step, x):
    times = defaultdict(list)
    orig = RegionRunner.__call__

    def timed(self, *args):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = orig(self, *args)
        e.record()
        times[self].append((s, e))
        return out

    RegionRunner.__call__ = timed
    try:
        for _ in range(STEPS):
            step(x)
        torch.cuda.synchronize()
    finally:
        RegionRunner.__call__ = orig
    rows = []
    for runner, evs in times.items():
        ms = sum(s.elapsed_time(e) for s, e in evs) / STEPS
        plan = next(iter(runner.plans.values()))
        segs = []
        for seg in runner.segments:
            k = plan.kernels.get(seg.index)
            how = "ref" if k is None else k.mode
            segs.append(f"{seg.kind}:{how}")
        rows.append((ms, runner.region.name, len(runner.region.nodes), " ".join(segs)))
    total = sum(r[0] for r in rows)
    print(f"  fuser regions: {total:.3f} ms per step over {len(rows)} regions")
    for ms, name, n, segs in sorted(rows, reverse=True)[:16]:
        print(f"  {ms:8.3f} ms  {name:8s} {n:3d} ops  {segs[:110]}")


def main():
    b, s = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (8, 1024)
    torch.manual_seed(0)
    block = TransformerBlock().cuda().to(torch.bfloat16)
    x = torch.randn(b, s, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for kind in ("thunder+fuser", "thunder+torchcompile", "torch.compile"):
        step = _block_contender(kind, copy.deepcopy(block))
        for _ in range(3):
            step(x)
        torch.cuda.synchronize()
        print(f"== {kind} [{b}, {s}, 1024]")
        kernel_table(step, x)
        if kind == "thunder+fuser":
            region_table(step, x)


if __name__ == "__main__":
    main()
