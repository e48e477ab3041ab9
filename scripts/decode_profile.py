"""Where a decode step's time goes (GPU machine): per contender of ``benchmarks/decode``, the
wall time per one-token step, the GPU time of its kernels and their count (torch.profiler),
and for the ungraphed thunder + fuser step, whose Python the host waits on (cProfile,
grouped by package, then the heaviest functions). A step whose wall time is well above its
GPU time is bound by the host. Each region call runs in a profiler range of its name
(``THUNDER_FUSER_RANGES=1``), so the GPU time of the ungraphed step is also given per
launcher: each region (its kernels and any copy torch makes for it) and each torch op
between regions.

    python scripts/decode_profile.py [--model Llama-3.2-1B --layers 4 --contenders ...]
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
from benchmarks.contenders import wrap  # noqa: E402
from benchmarks.decode import PROMPT, WARMUP, _model  # noqa: E402
from benchmarks.launchers import by_launcher  # noqa: E402


def _steps(fn, token, n: int, start: int, device) -> None:
    for i in range(n):
        logits = fn(token, input_pos=torch.tensor([start + i], device=device))
        token = logits.argmax(-1)
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Llama-3.2-1B")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--contenders", default="eager,thunder+fuser,thunder+fuser graphed,torch.compile reduce-overhead")
    ap.add_argument("--cprofile", default="thunder+fuser")
    a = ap.parse_args()
    device = torch.device("cuda")
    rows = []
    for kind in a.contenders.split(","):
        m, _ = _model(a.model, a.layers, device, torch.bfloat16)
        fn = wrap(kind, m)
        token = torch.zeros(1, 1, dtype=torch.long, device=device)
        with torch.no_grad():
            fn(torch.zeros(1, PROMPT, dtype=torch.long, device=device), input_pos=torch.arange(PROMPT, device=device))
            _steps(fn, token, WARMUP, PROMPT, device)  # kernels compiled in workers are in use by then
            t0 = time.perf_counter()
            _steps(fn, token, 50, PROMPT + 10, device)
            wall = (time.perf_counter() - t0) / 50 * 1000
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
                _steps(fn, token, 20, PROMPT + 60, device)
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            gpu = sum(e.device_time for e in kernels) / 20 / 1000
            names: dict[str, float] = {}
            for e in kernels:
                names[e.name[:70]] = names.get(e.name[:70], 0.0) + e.device_time / 20
            rows.append((kind, wall, gpu, len(kernels) / 20))
            print(f"== {kind}: {wall:.3f} ms/step wall, {gpu:.3f} ms GPU, {len(kernels) / 20:.0f} kernels")
            for n, us in sorted(names.items(), key=lambda kv: -kv[1])[:12]:
                print(f"   {us:8.1f} us  {n}")
            if kind.startswith("thunder+fuser") and not kind.endswith("graphed"):
                print("   by launcher (GPU us per step):")
                for n, us in sorted(by_launcher(prof, 20).items(), key=lambda kv: -kv[1])[:40]:
                    print(f"   {us:8.1f} us  {n}")
            if kind == a.cprofile:
                p = cProfile.Profile()
                p.enable()
                _steps(fn, token, 50, PROMPT + 80, device)
                p.disable()
                st = pstats.Stats(p)
                groups: dict[str, float] = {}
                for (path, _, _), (_, _, tottime, _, _) in st.stats.items():
                    key = ("thunder_fuser" if "thunder_fuser" in path else "thunder" if "/thunder/" in path else
                           "litgpt" if "litgpt" in path else "torch" if "/torch/" in path else
                           "C (torch ops, launches)" if path == "~" else "other")
                    groups[key] = groups.get(key, 0.0) + tottime
                for k, v in sorted(groups.items(), key=lambda kv: -kv[1]):
                    print(f"  {k:28s} {v / 50 * 1000:7.3f} ms/step (under cProfile)")
                st.sort_stats("tottime").print_stats(25)
        torch._dynamo.reset()
    print("| contender | wall ms/step | GPU ms/step | kernels/step |\n| --- | ---: | ---: | ---: |")
    for kind, wall, gpu, k in rows:
        print(f"| {kind} | {wall:.3f} | {gpu:.3f} | {k:.0f} |")


if __name__ == "__main__":
    main()
