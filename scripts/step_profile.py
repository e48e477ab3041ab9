"""Where a training step's host time goes (GPU machine): a model of ``benchmarks/model_zoo``
through thunder + fuser, 20 steady steps under cProfile, time grouped by package (ours,
thunder, torch) and the heaviest functions. A step whose GPU time is below its host time
is host-bound; this says whose Python it waits on. On a GPU it then gives the step's GPU
time by launcher (``benchmarks/launchers.py``): each region, each copy made for one, each
torch op between them.

    python scripts/step_profile.py pythia-410m [--batch 2 --seq 1024 --contender thunder+fuser]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

os.environ.setdefault("THUNDER_FUSER_RANGES", "1")  # before the regions are built

import torch  # noqa: E402

import thunder_fuser  # noqa: F401,E402
from benchmarks.launchers import by_launcher, copy_chains  # noqa: E402
from benchmarks.model_zoo import batch, build  # noqa: E402
from benchmarks.contenders import wrap  # noqa: E402
from benchmarks.models import _step, _zero  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--contender", default="thunder+fuser")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    built = build(a.model, a.layers, tiny=not cuda, device="cuda" if cuda else "cpu",
                  dtype=torch.bfloat16 if cuda else torch.float32)
    idx, targets = batch(built, a.batch, a.seq, device=idx_device(cuda))
    fn = wrap(a.contender, built.module)
    for _ in range(3):
        _zero(built.module)
        _step(fn, idx, targets)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        _zero(built.module)
        _step(fn, idx, targets)
    issued = (time.perf_counter() - t0) / a.steps * 1000
    sync()
    done = (time.perf_counter() - t0) / a.steps * 1000
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.steps):
        _zero(built.module)
        _step(fn, idx, targets)
    sync()
    prof.disable()
    stats = pstats.Stats(prof)
    groups: dict[str, float] = {}
    for (path, _, name), (_, _, tottime, _, _) in stats.stats.items():
        key = ("thunder_fuser" if "thunder_fuser" in path else "thunder" if "/thunder/" in path else
               "torch" if "/torch/" in path else "C (torch ops, launches)" if path == "~" else "other")
        groups[key] = groups.get(key, 0.0) + tottime
    print(f"{a.model} {a.contender}: {issued:.2f} ms/step issued, {done:.2f} ms/step done (no profiler)")
    for k, v in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {k:28s} {v / a.steps * 1000:7.2f} ms/step (under cProfile)")
    stats.sort_stats("tottime").print_stats(30)
    if cuda:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                _zero(built.module)
                _step(fn, idx, targets)
            sync()
        print("GPU us per step by launcher (a region, a copy inside one, or a torch op):")
        for name, us in sorted(by_launcher(prof, 5).items(), key=lambda kv: -kv[1])[:40]:
            print(f"  {us:9.1f} us  {name}")
        print("Copies per step, by what made them:")
        for name, us in sorted(copy_chains(prof, 5).items(), key=lambda kv: -kv[1])[:20]:
            print(f"  {us:9.1f} us  {name[-300:]}")


def idx_device(cuda: bool) -> str:
    return "cuda" if cuda else "cpu"


if __name__ == "__main__":
    main()
