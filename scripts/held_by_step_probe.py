"""Held memory and CUDA graph counts of thunder + fuser, step by step (GPU machine).

    python scripts/held_by_step_probe.py [MODEL]     # a benchmarks.model_zoo name, pythia-410m by default

What a training loop holds moves in its first steps: the launch runs capture at a key's
second sighting, and their first capture allocates the capture stream's cuBLAS workspace
(``runtime/region_graphs.py``). Session 44 on the H100: pythia-410m and Qwen2 captured from
the fourth step, held +0.0324 GiB from there on, and Qwen2 still captured 2-3 graphs a step
at the eighth (keys that drift). The model benchmark's ``settle`` reads memory once a step
neither captures nor sights a key; this shows the steps it waits for.
"""

import gc
import sys
import time

import thunder_fuser  # noqa: F401 - before thunder (torch 2.13 compat)
import torch

from benchmarks.contenders import wrap
from benchmarks.model_zoo import batch, build
from benchmarks.models import _step, _zero
from thunder_fuser.runtime import region_graphs as rg


def runs() -> tuple[int, int, int]:
    """Launch runs (their ``RegionGraphs`` share ``MatmulCapture``'s retirement): how many,
    their graphs, and those graphs' replays."""
    owners = list(rg.MatmulCapture.retirement.owners)
    return len(owners), sum(len(o.graphs) for o in owners), sum(g[1] for o in owners for g in o.graphs.values())


def main(name: str, steps: int = 8) -> None:
    b = build(name, 2, device="cuda", dtype=torch.bfloat16)
    idx, targets = batch(b, 2, 1024, device="cuda")
    m = b.module
    _step(m, idx, targets)  # eager's matmuls first: the default stream's workspace exists, as in the benchmark
    _zero(m)
    torch.cuda.synchronize()
    gc.collect()
    base = torch.cuda.memory_allocated()
    fn = wrap("thunder+fuser", m)
    for i in range(steps):
        t0 = time.perf_counter()
        _step(fn, idx, targets)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        _zero(m)
        gc.collect()
        held = (torch.cuda.memory_allocated() - base) / 2**30
        print(f"step {i}: {ms:9.2f} ms, held {held:.4f} GiB over eager's, region graphs {rg.stats}, "
              f"runs (runs, graphs, replays) {runs()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "pythia-410m")
