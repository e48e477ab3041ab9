"""How fast can any thunder step of a model be issued (GPU machine)? A host-bound step is
the host's: this measures thunder + fuser's step beside the same step with every region
call made free (each returns the outputs it returned once, at once: nothing allocated,
nothing launched), "the thunder floor". What remains is thunder's own work (prologue
checks, autograd, the trace's Python) and the torch ops between regions (matmuls,
attention, the KV cache's ``index_copy_``). A target below the floor no region work can
reach; the gap between the step and the floor is what our region calls cost.

Training (``--model``, a model of ``benchmarks/model_zoo``): torch.compile's step, ours,
ours with the regions' launches made plainly (``benchmarks.contenders``'
``thunder+fuser no-region-graphs``) and the floor, timed in 10 turns over the four (a lent
host drifts by tens of percent within a minute), each the median of its steps between CUDA events as ``benchmarks.models``
times them, plus the host's issue time per step. Decode
(``--decode``): ``benchmarks.decode``'s litgpt step, eager's, ours, the floor, ours
again, wall time per step with the host waiting for each step's token. Hosts differ
between lent machines by up to 1.6x: compare within one run. Without a GPU it runs tiny
models on the CPU (a smoke test of the script, nothing to read in its numbers).

    python scripts/thunder_floor.py --model pythia-410m
    python scripts/thunder_floor.py --decode [--decode-model Llama-3.2-1B --layers 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import thunder_fuser  # noqa: F401  (torch compat stubs before thunder)
from benchmarks.contenders import wrap
from thunder_fuser.cudagraphs import region_graphs
from thunder_fuser.runtime.region_runner import RegionRunner


CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
sync = torch.cuda.synchronize if CUDA else (lambda: None)


class free_regions:
    """Runs ``run`` once, recording each region call's outputs; inside the block every
    region it called returns those outputs at once (``as`` gives how many regions)."""

    def __init__(self, run):
        self.run, self.saved = run, {}

    def __enter__(self):
        recorded = {}
        call, direct = RegionRunner.call, RegionRunner.__call__  # thunder calls the second

        def record(out, runner):
            recorded[id(runner)] = (runner, list(out))
            return out

        RegionRunner.call = lambda runner, args: record(call(runner, args), runner)
        RegionRunner.__call__ = lambda runner, *args: record(direct(runner, *args), runner)
        try:
            self.run()
        finally:
            RegionRunner.call, RegionRunner.__call__ = call, direct
        for runner, outs in recorded.values():
            self.saved[id(runner)] = (runner, runner.fast)
            runner.fast = lambda args, outs=outs: list(outs)
        return len(recorded)

    def __exit__(self, *exc):
        for runner, fast in self.saved.values():
            runner.fast = fast


def training(model: str, layers: int, steps: int) -> None:
    from contextlib import nullcontext

    from benchmarks.model_zoo import batch, build
    from benchmarks.models import ROUNDS, _step, _time_steps, _zero, time_interleaved

    built = build(model, layers, tiny=not CUDA, device=DEVICE, dtype=torch.bfloat16 if CUDA else torch.float32)
    idx, targets = batch(built, 2, 1024 if CUDA else 16, device=DEVICE)
    m = built.module
    tc, fn, plain = wrap("torch.compile", m), wrap("thunder+fuser", m), wrap("thunder+fuser no-region-graphs", m)
    free = lambda: free_regions(lambda: _step(fn, idx, targets))  # noqa: E731
    # (label, step, context): the floor is thunder + fuser's step inside ``free_regions``
    entries = [("torch.compile", tc, nullcontext), ("thunder+fuser", fn, nullcontext),
               ("thunder+fuser, no region graphs", plain, nullcontext), ("floor", fn, free)]
    for _, f, _ in entries[:3]:
        for _ in range(3):
            _zero(m)
            _step(f, idx, targets)
    sync()
    calls = [0]

    def turn(f, context, res):
        """A turn's steps between CUDA events, then as many again timed on the host alone."""
        def time_steps(n: int) -> list[float]:
            with context() as freed:
                calls[0] = freed or calls[0]
                times = _time_steps(f, m, idx, targets, n)
                t0 = time.perf_counter()
                for _ in range(n):
                    _zero(m)
                    _step(f, idx, targets)
                res["issued"].append((time.perf_counter() - t0) / n * 1e3)
                sync()
            return times
        return time_steps

    results = {label: {"error": None, "issued": []} for label, _, _ in entries}
    # in turns (``benchmarks.models``'): a lent host's speed drifts by tens of percent within a minute
    time_interleaved([(results[label], turn(f, c, results[label])) for label, f, c in entries], steps, 2, idx.shape[1])
    print(f"| model | step ({ROUNDS} turns) | ms | host ms issuing it |\n| --- | --- | ---: | ---: |")
    for label, res in results.items():
        name = f"thunder floor ({calls[0]} region calls free)" if label == "floor" else label
        ms = res.get("step_ms", res["error"])
        print(f"| {model} | {name} | {ms} | {statistics.median(res['issued']):.3f} |", flush=True)
    print(f"region graphs (thunder+fuser): {region_graphs.stats}")


def decode(model: str, layers: int, steps: int) -> None:
    from benchmarks.decode import PROMPT, _model

    dev = DEVICE

    def wall(fn, n: int) -> float:
        token, times = torch.tensor([[1]], device=dev), []
        for i in range(n):
            t0 = time.perf_counter()
            logits = fn(token, input_pos=torch.tensor([PROMPT + 4 + i % 400], device=dev))
            token = logits.argmax(-1)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times[n // 4:])

    print("| model | decode step | wall ms | x eager |\n| --- | --- | ---: | ---: |")
    eager = None
    with torch.no_grad():
        for kind in ("eager", "thunder+fuser"):
            m, _ = _model(model, layers, dev, torch.bfloat16 if CUDA else torch.float32)
            fn = wrap(kind, m)
            fn(torch.arange(PROMPT, device=dev).view(1, -1), input_pos=torch.arange(PROMPT, device=dev))
            wall(fn, 20)
            rows = [(kind, wall(fn, steps))]
            if kind != "eager":
                with free_regions(lambda fn=fn: wall(fn, 1)) as calls:
                    rows.append((f"thunder floor ({calls} region calls free)", wall(fn, steps)))
                rows.append((f"{kind} again", wall(fn, steps)))
            for label, ms in rows:
                eager = eager or ms
                print(f"| {model} | {label} | {ms:.3f} | {ms / eager:.2f} |", flush=True)
            del m, fn
            if CUDA:
                torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="pythia-410m")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--decode-model", default="Llama-3.2-1B")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    a = ap.parse_args()
    if a.decode:
        decode(a.decode_model, a.layers or 4, a.steps or 200)
    else:
        training(a.model, a.layers or 2, a.steps or 30)


if __name__ == "__main__":
    main()
