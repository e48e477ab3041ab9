"""What is alive at a training step's memory peak (GPU machine): one step of a model of
``benchmarks/model_zoo`` per contender under torch's allocator history, replayed to the
moment the step's allocations peak; the largest blocks then alive, each with the frame of
the trace (thunder's generated forward or backward, our regions' runners) or model code
that allocated it. Before it, ``--warm`` steps, each printing the memory it leaves allocated
and the CUDA graphs captured so far: a training loop's memory moves in its first steps
(session 44, H100: pythia-410m's and Qwen2's launch runs first captured in the fourth step,
allocating their capture stream's 32 MiB cuBLAS workspace, held from there on; Qwen2 still
captured 2-3 graphs a step at the eighth). The traces go to OUT_DIR so that their line numbers read as ops
(``thunder_fuser-fwd.txt``, ``thunder_fuser-bwd.txt``, and the regions' generated code,
``thunder_fuser-runners.txt``).

    python scripts/peak_memory.py pythia-410m OUT_DIR [--contenders thunder+fuser,torch.compile] [--warm 8]
"""

from __future__ import annotations

import argparse
import os

import torch

import thunder_fuser  # noqa: F401
import thunder
from benchmarks.contenders import wrap
from benchmarks.model_zoo import batch, build
from benchmarks.models import _step, _zero
from thunder_fuser.cudagraphs import region_graphs


def _frame(frames) -> str:
    """The innermost frame of a trace, a region runner or model code (else the innermost)."""
    for f in frames:
        name = f["filename"]
        if name.startswith(("thunder.", "<thunder_fuser")) or "litgpt" in name or "transformers" in name:
            return f"{name}:{f['line']} {f['name']}"
    return f"{frames[0]['filename']}:{frames[0]['line']} {frames[0]['name']}" if frames else "?"


def runs() -> tuple[int, int, int]:
    """Launch runs (their ``RegionGraphs`` share ``MatmulCapture``'s retirement): how many,
    their graphs, and those graphs' replays."""
    owners = list(region_graphs.MatmulCapture.retirement.owners)
    return len(owners), sum(len(o.graphs) for o in owners), sum(g[1] for o in owners for g in o.graphs.values())


def peak_live(trace) -> tuple[int, list]:
    """(peak bytes over the start, the blocks alive then: (bytes, frame)) from the allocator's
    events."""
    live, cur, peak, at_peak = {}, 0, 0, {}
    for ev in trace:
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], _frame(ev.get("frames", [])))
            cur += ev["size"]
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            cur -= live.pop(ev["addr"])[0]
    return peak, sorted(at_peak.values(), reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--contenders", default="thunder+fuser,torch.compile")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--warm", type=int, default=8, help="steps before the one recorded")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    built = build(a.model, a.layers, device="cuda", dtype=torch.bfloat16)
    idx, targets = batch(built, a.batch, a.seq, device="cuda")
    for kind in a.contenders.split(","):
        fn = wrap(kind, built.module)
        for i in range(a.warm):
            _zero(built.module)
            _step(fn, idx, targets)
            _zero(built.module)
            torch.cuda.synchronize()
            print(f"== {a.model} {kind}: after step {i} {torch.cuda.memory_allocated() / 2**20:.1f} MiB allocated, "
                  f"{torch.cuda.memory_reserved() / 2**20:.1f} MiB reserved; region graphs {region_graphs.stats}, "
                  f"launch runs (runs, graphs, replays) {runs()}")
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
        _step(fn, idx, targets)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak, blocks = peak_live(snap["device_traces"][0])
        print(f"== {a.model} {kind}: peak {peak / 2**20:.1f} MiB over the step's start, "
              f"{len(blocks)} blocks alive then")
        by_frame: dict = {}
        for size, frame in blocks:
            n, total = by_frame.get(frame, (0, 0))
            by_frame[frame] = (n + 1, total + size)
        for frame, (n, total) in sorted(by_frame.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"  {total / 2**20:9.1f} MiB  {n:3d}x  {frame}")
        if kind.startswith("thunder"):
            stem = kind.replace("+", "_")
            with open(os.path.join(a.out, f"{stem}-fwd.txt"), "w") as f:
                f.write(str(thunder.last_traces(fn)[-1]))
            with open(os.path.join(a.out, f"{stem}-bwd.txt"), "w") as f:
                f.write(str(thunder.last_backward_traces(fn)[-1]))
            with open(os.path.join(a.out, f"{stem}-runners.txt"), "w") as f:  # <thunder_fuser fuserN>'s lines
                for trace in (thunder.last_traces(fn)[-1], thunder.last_backward_traces(fn)[-1]):
                    for name, obj in trace.python_ctx().items():
                        src = getattr(getattr(obj, "fast", None), "source", None)
                        if name.startswith("fuser") and src:
                            f.write(f"== {name}\n{src}\n")


if __name__ == "__main__":
    main()
