"""How fast can a thunder step's first call be in a fresh process (GPU machine)?

A second process, its kernels in the disk cache, still takes a first step: that step is thunder's tracing and transforms,
which no executor skips: this measures the floor, thunder.jit with only thunder's torch
executor (nothing compiled, nothing fused), beside thunder + fuser's first step with a cold
kernel cache and then with a warm one, each in a process of its own, as a user's second
process would take it. Imports are timed apart (about 10 s on a lent H100 host).

    python scripts/first_call_floor.py --models pythia-410m,hf-Qwen2,Llama-3.2-1B

``--one MODEL MODE`` (internal) takes one first step in this process and prints it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

MODES = ("cold", "warm", "torch executor")


def one(name: str, mode: str) -> None:
    t0 = time.perf_counter()
    import thunder_fuser  # noqa: F401, I001  (torch compat stubs before thunder)
    import thunder
    import torch

    from benchmarks.models import warm_first_call

    imports = time.perf_counter() - t0
    jit = None
    if mode == "torch executor":
        from thunder.executors.torchex import ex as torch_ex

        jit = lambda m: thunder.jit(m, executors=[torch_ex])  # noqa: E731
    cuda = torch.cuda.is_available()
    s = warm_first_call(name, 2, 2, 1024 if cuda else 16, tiny=not cuda, jit=jit)
    print(f"FIRST {s:.2f} {imports:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="pythia-410m,hf-Qwen2,Llama-3.2-1B,gemma-2b,hf-Llama")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "MODE"))
    a = ap.parse_args()
    if a.one:
        one(a.one[0], a.one[1])
        return
    cache = tempfile.mkdtemp(prefix="fuser_cache_")  # cold for each model's first process
    print("| model | fuser, cold cache | fuser, warm cache | thunder, torch executor only | imports |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in a.models.split(","):
        row, imports = [], []
        for mode in MODES:
            p = subprocess.run([sys.executable, __file__, "--one", name, mode], capture_output=True, text=True,
                               env=dict(os.environ, THUNDER_FUSER_CACHE=cache))
            line = [x for x in p.stdout.splitlines() if x.startswith("FIRST ")]
            row.append(line[-1].split()[1] if line else f"failed: {p.stderr[-200:]!r}")
            imports.append(line[-1].split()[2] if line else "")
        print(f"| {name} | {' | '.join(row)} | {', '.join(imports)} |", flush=True)


if __name__ == "__main__":
    main()
