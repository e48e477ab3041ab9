"""What a training step's region calls cost the host, in place and alone (GPU machine).

A host-bound step (pythia-410m at 2 x 1024 tokens) is as fast as thunder's own per-step work
(``scripts/thunder_floor.py``: the step with every region call free) plus our region calls.
This measures those calls three ways, in 5 turns: in place (each call of real steps timed
with ``perf_counter``), replayed in the step's order with nothing between, and each alone
(its call repeated, caches hot); beside the step and the floor. Then, per region, its call
alone as it is, with its kernel launches made no-ops, and with its allocations too (the
rest is guards, views and Python), with the launches, allocations and views its
straight-line code makes (``runtime/straight_line.py``).

    python scripts/region_host_probe.py [pythia-410m]

Session 38, H100 hosts (two runs, two hosts): pythia's 19 region calls cost 0.71 ms in place
(step 3.30 ms, floor 2.60), 0.54 replayed, 0.50 alone; alone: 31 launches 0.27 ms (8.6 us
each), 80 allocations 0.10, the rest 0.12. transformers' Qwen2: 25 calls, 1.34 ms in place
(step 5.46, floor 3.90); 46 launches 0.42, 78 allocations 0.16, the rest 0.38.
"""
import re
import statistics
import sys
import time

import torch

import thunder_fuser  # noqa: F401  (before thunder)
from benchmarks.contenders import wrap
from benchmarks.model_zoo import batch, build
from benchmarks.models import _step, _zero
from benchmarks.timing import host_us_interleaved
from scripts.thunder_floor import free_regions
from thunder_fuser.runtime import region_runner as rr

if not torch.cuda.is_available():
    sys.exit("region_host_probe.py needs a CUDA device (it times CuTe DSL launches)")


def record_calls(fn, m, idx, targets) -> list:
    """(runner, arguments, outputs) of each region call of one step."""
    calls, call = [], rr.RegionRunner.__call__

    def note(self, *args):
        out = call(self, *args)
        calls.append((self, args, out))
        return out

    rr.RegionRunner.__call__ = note
    try:
        _zero(m)
        _step(fn, idx, targets)
    finally:
        rr.RegionRunner.__call__ = call
    return calls


def in_turns(fn, m, idx, targets, calls, turns: int = 5, steps: int = 10) -> dict:
    """ms per step: the step, its region calls in place, replayed in order, each alone, the floor."""
    def issue(n=steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            _zero(m)
            _step(fn, idx, targets)
        t = (time.perf_counter() - t0) / n * 1e3
        torch.cuda.synchronize()
        return t

    call, spent, clock = rr.RegionRunner.__call__, [0.0], time.perf_counter

    def timed(self, *args):
        t0 = clock()
        out = call(self, *args)
        spent[0] += clock() - t0
        return out

    res = {k: [] for k in ("step", "region calls in place", "replayed in order", "each alone", "floor")}
    for _ in range(turns):
        res["step"].append(issue())
        rr.RegionRunner.__call__, spent[0] = timed, 0.0
        try:
            issue()
        finally:
            rr.RegionRunner.__call__ = call
        res["region calls in place"].append(spent[0] / steps * 1e3)
        with free_regions(lambda: _step(fn, idx, targets)):
            res["floor"].append(issue())
        t0 = time.perf_counter()
        for _ in range(steps):
            for r, a, _ in calls:
                r(*a)
        res["replayed in order"].append((time.perf_counter() - t0) / steps * 1e3)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for r, a, _ in calls:
            for _ in range(steps):
                r(*a)
        res["each alone"].append((time.perf_counter() - t0) / steps * 1e3)
        torch.cuda.synchronize()
    return res


def per_region(calls) -> list:
    """Per region: arguments, outputs, launches, allocations, views, and us per call alone as
    it is, with no-op launches, and with no-op launches and allocations."""
    noop = lambda *a, **k: None  # noqa: E731
    rows = []
    for r, args, out in calls:
        f = r.fast
        if f is None:
            continue
        g, src = f.__globals__, f.source
        launches = {k: v for k, v in g.items() if k.startswith(("kernel", "group"))}
        empty, made = g.get("empty_cuda"), {}

        def reused(shape, strides, dtype, _made=made, _empty=empty):
            t = _made.get((shape, strides, dtype))
            if t is None:
                t = _made[(shape, strides, dtype)] = _empty(shape, strides, dtype)
            return t

        us = {"as it is": host_us_interleaved({"x": lambda: r(*args)}, calls=100, rounds=3, issue_only=True)["x"][0]}
        g.update({k: noop for k in launches})
        us["no launches"] = host_us_interleaved({"x": lambda: r(*args)}, calls=100, rounds=3, issue_only=True)["x"][0]
        if empty is not None:
            g["empty_cuda"] = reused
        us["nor allocations"] = host_us_interleaved({"x": lambda: r(*args)}, calls=100, rounds=3, issue_only=True)["x"][0]
        g.update(launches)
        if empty is not None:
            g["empty_cuda"] = empty
        rows.append((r.__name__, sum(isinstance(a, torch.Tensor) for a in args), len(out),
                     len(re.findall(r"\b(?:kernel|group)\d+\(", src)), src.count("empty_cuda(") + src.count("empty_strided("),
                     src.count("reinterpret(") + src.count(".as_strided("), *us.values()))
    return rows


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "pythia-410m"
    built = build(name, 2, tiny=False, device="cuda", dtype=torch.bfloat16)
    idx, targets = batch(built, 2, 1024, device="cuda")
    m = built.module
    fn = wrap("thunder+fuser no-region-graphs", m)  # each launch timed: no region graphs
    for _ in range(5):
        _zero(m)
        _step(fn, idx, targets)
    torch.cuda.synchronize()
    calls = record_calls(fn, m, idx, targets)
    res = in_turns(fn, m, idx, targets, calls)
    rows = per_region(calls)
    print("| region | tensors in | outputs | launches | allocations | views | us alone | no launches | nor allocations |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print("| %s | %d | %d | %d | %d | %d | %.1f | %.1f | %.1f |" % row)
    sums = [sum(row[i] for row in rows) for i in range(3, 9)]
    print("%s, %d region calls: %d launches, %d allocations, %d views; us alone %.0f, no launches %.0f, nor allocations %.0f"
          % (name, len(calls), *sums))
    print(f"| {name}, ms per step (5 turns) | median | least |\n| --- | ---: | ---: |")
    for k, v in res.items():
        print(f"| {k} | {statistics.median(v):.3f} | {min(v):.3f} |")


if __name__ == "__main__":
    main()
