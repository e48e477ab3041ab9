"""Where a jitted optimizer step's host time goes (GPU machine): torch's AdamW over a zoo
model's parameters (default GPT-2 124M, 148 tensors: a step bound by the host), as
``thunder.jit(opt.step, executors=thunder_fuser.executors())`` beside torch's fused AdamW.

For each: the host time to issue one step and to finish it (median of 20, synchronized),
steps queued back to back, one profiled step's GPU ops (their sum against their span, the
widest gaps with the ops around them, the slowest CUDA runtime calls); for the jitted
step also each CUDA graph replay's host time, the update call's and the host part's
(``_group_call``).

First measured (H200, torch 2.11, GPT-2 124M bf16): fused AdamW issues in 0.52 ms and
finishes in 1.13 (GPU 0.67); the jitted step issues in 3.11 ms, finishes in 3.54, its 28
kernels take 0.53 ms of GPU time, and the GPU waits 3.7 ms between the scalars' copies and
the update's graph; under cProfile its region graph's ``CUDAGraph.replay`` took 2.5 ms a
step while the trace's ``cudaGraphLaunch`` took 95 us. The replay times below say which.

    python scripts/optimizer_step_host.py [--model hf-GPT2 --layers 12] [--cprofile 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

import thunder_fuser
import thunder
from benchmarks import model_zoo


def stepper(params: list, kind: str):
    ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(ps, params):
        p.grad = q.grad
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, fused=(kind == "fused"))
    step = thunder.jit(opt.step, executors=thunder_fuser.executors()) if kind == "jit" else opt.step
    for _ in range(4):  # the first is torch's own (the state), the second compiles, graphs capture after
        step()
    return step


def timed(fn, rec: list):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        rec.append(time.perf_counter() - t0)
        return out

    return wrapper


def timeline(step) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        step()
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    ops = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: -e["dur"])[:6]
    span = ops[-1]["ts"] + ops[-1]["dur"] - ops[0]["ts"] if ops else 0.0
    print(f"  {len(ops)} GPU ops, {sum(o['dur'] for o in ops) / 1e3:.3f} ms of GPU time over a span of {span / 1e3:.3f} ms")
    gaps = [(ops[i + 1]["ts"] - ops[i]["ts"] - ops[i]["dur"], ops[i]["name"][:50], ops[i + 1]["name"][:50])
            for i in range(len(ops) - 1)]
    for us, before, after in sorted(gaps, reverse=True)[:4]:
        print(f"  gap {us:8.1f} us  {before} -> {after}")
    for r in runtime:
        print(f"  runtime {r['name']:28s} {r['dur']:8.1f} us")


def host_profile(step, top: int) -> None:
    """cProfile over 20 steps: the functions with the most own time, then by cumulative time."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        step()
    prof.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        pstats.Stats(prof).sort_stats(key).print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="hf-GPT2")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--cprofile", type=int, default=0, help="also print the N functions with the most own host time")
    a = ap.parse_args()
    built = model_zoo.build(a.model, a.layers, False, "cuda", torch.bfloat16)
    params = list(built.module.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    print(f"{a.model} x{a.layers}: {len(params)} tensors, {sum(p.numel() for p in params) / 1e6:.0f}M parameters")
    for kind in ("fused", "jit"):
        step = stepper(params, kind)
        rec: dict[str, list] = {"replay": [], "update": [], "host part": []}
        if kind == "jit":
            replay = torch.cuda.CUDAGraph.replay
            torch.cuda.CUDAGraph.replay = timed(replay, rec["replay"])
            step.guarded_update = timed(step.guarded_update, rec["update"])
            step._group_call = timed(step._group_call, rec["host part"])
        issue, done = [], []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            issue.append((t1 - t0) * 1e3)
            done.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        queued = (time.perf_counter() - t0) / 50 * 1e3
        print(f"{kind}: issued in {statistics.median(issue):.3f} ms, done in {statistics.median(done):.3f} ms, "
              f"{queued:.3f} ms a step queued")
        for name, v in rec.items():
            if v:
                print(f"  {name:10s} {len(v):4d} calls, median {statistics.median(v) * 1e3:.3f} ms")
        if kind == "jit":
            torch.cuda.CUDAGraph.replay = replay
        timeline(step)
        if a.cprofile:
            host_profile(step, a.cprofile)
    host_floor(len(params))


def host_floor(n: int) -> None:
    """The host work that every step keeping torch's state must do: ``state["step"] += 1`` on
    ``n`` CPU counts (torch's foreach step does this too), and one CUDA graph's replay."""
    counts = [torch.tensor(0.0) for _ in range(n)]
    floor = {}
    for name, fn in (("_foreach_add_", lambda: torch._foreach_add_(counts, 1.0)),
                     ("_foreach_copy_", lambda: torch._foreach_copy_(counts, [counts[0]] * n))):
        ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        floor[name] = statistics.median(ts) * 1e3
    graph, x = torch.cuda.CUDAGraph(), torch.zeros(1, device="cuda")
    with torch.cuda.graph(graph):
        x.add_(1)
    rs = []
    for _ in range(50):
        t0 = time.perf_counter()
        graph.replay()
        rs.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    print(f"host floor: {n} CPU counts += 1 by " + ", ".join(f"{k} {v:.3f} ms" for k, v in floor.items()) + ", "
          f"a one-kernel graph's replay {statistics.median(rs) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
