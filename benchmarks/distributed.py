"""Training steps on several GPUs (issue 34): tokens/s per contender, scaling from one GPU,
and how much of the communication runs under compute.

    python -m benchmarks.distributed --out DIR [--model pythia-410m --layers 2 --seq 1024]

Spawns one process per GPU (NCCL; on a machine without GPUs, two CPU processes over gloo: the
harness's smoke test, whose timings mean nothing). Contenders, each sharding its parameters
ZERO3-style: thunder + fuser under ``thunder.distributed.fsdp`` (ZERO2 and ZERO3),
thunder + torch.compile executor under the same, and torch.compile of the model wrapped in
PyTorch's FSDP2 (``fully_shard``). Each rank steps its own rows (``--batch`` per rank); step
time is the median over ``--steps`` steps; one step runs under torch.profiler, and on GPUs
the fraction of the NCCL kernels' time that overlaps a compute kernel on the device timeline
is "hidden". A one-process run of thunder + fuser gives the scaling. Writes
``distributed.json`` and prints a table last.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
import traceback

import torch

from benchmarks import cli

CONTENDERS = ("thunder+fuser zero2", "thunder+fuser zero3", "thunder+torchcompile zero3", "torch.compile + FSDP2")


def _wrap(kind: str, module, device):
    import thunder
    from thunder.distributed import FSDPType, fsdp

    from benchmarks.contenders import thunder_executors, thunder_transforms

    if kind == "torch.compile + FSDP2":
        from torch.distributed.fsdp import fully_shard

        for block in module.model.transformer.h:
            fully_shard(block)
        fully_shard(module)
        return torch.compile(module)
    jm = thunder.jit(module, executors=thunder_executors(kind), transforms=thunder_transforms(kind))
    if kind == "thunder+fuser 1 GPU":
        return jm
    strategy = FSDPType.ZERO2 if kind.endswith("zero2") else FSDPType.ZERO3
    return fsdp(jm, device=device, sharding_strategy=strategy)


def _hidden_fraction(prof) -> float | None:
    """Of the NCCL kernels' device time, the part during which a compute kernel also runs."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    comm = [(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()]
    work = sorted((e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower())
    total = sum(b - a for a, b in comm)
    if not total:
        return None
    covered = 0.0
    for a, b in comm:
        for s, e in work:
            if e <= a:
                continue
            if s >= b:
                break
            covered += min(b, e) - max(a, s)
    return round(min(covered / total, 1.0), 3)


def _rank(rank: int, world: int, port: int, a, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    import torch.distributed as dist

    import thunder_fuser  # noqa: F401
    from benchmarks.model_zoo import batch, build
    from benchmarks.models import _step, _zero

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    kinds = CONTENDERS if world > 1 else ("thunder+fuser 1 GPU",)
    out = {}
    for kind in kinds:
        try:
            built = build(a.model, a.layers, tiny=not cuda, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
            idx, targets = batch(built, a.batch, a.seq if cuda else 16, device=device, seed=1 + rank)
            fn = _wrap(kind, built.module, device)
            params = list(fn.parameters())
            for _ in range(3):
                for p in params:
                    p.grad = None
                _step(fn, idx, targets)
            times = []
            for _ in range(a.steps):
                for p in params:
                    p.grad = None
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                _step(fn, idx, targets)
                if cuda:
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1000)
            ms = statistics.median(times)
            r = {"step_ms": round(ms, 3), "tokens_per_s": round(idx.numel() * world / ms * 1000), "error": None}
            if cuda:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    _step(fn, idx, targets)
                    torch.cuda.synchronize()
                r["comm_hidden"] = _hidden_fraction(prof)
            _zero(built.module)
        except Exception as e:  # noqa: BLE001 - a failing contender is reported
            r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            traceback.print_exc()
        out[kind] = r
        torch._dynamo.reset()
    if world > 1:
        dist.destroy_process_group()
    queue.put((rank, out))


def _launch(world: int, a) -> dict:
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_rank, args=(r, world, port, a, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=3000) for _ in procs)
    for p in procs:
        p.join()
    return results[0]  # rank 0's view (every rank steps in lockstep)


def main(argv=None) -> None:
    ap = cli.parser("benchmarks.distributed", __doc__, epilog=f"contenders: {', '.join(CONTENDERS)}\n"
                    "Without a CUDA GPU two CPU processes step over gloo (a smoke test).")
    ap.add_argument("--out", default="benchmarks/results", help="folder for distributed.json")
    ap.add_argument("--model", default="pythia-410m", help="the litgpt model")
    ap.add_argument("--layers", type=int, default=2, help="transformer layers")
    ap.add_argument("--batch", type=int, default=2, help="rows per rank")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per row")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per contender")
    a = ap.parse_args(argv)
    world = torch.cuda.device_count() if torch.cuda.is_available() else 2
    doc = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (gloo: a smoke test)",
           "world": world, "model": a.model, "layers": a.layers, "rows_per_rank": a.batch, "seq": a.seq,
           "one_gpu": _launch(1, a), "contenders": _launch(world, a) if world > 1 else {}}
    one = doc["one_gpu"].get("thunder+fuser 1 GPU", {}).get("tokens_per_s")
    for r in doc["contenders"].values():
        if one and r.get("tokens_per_s"):
            r["scaling"] = round(r["tokens_per_s"] / one, 2)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "distributed.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"| contender | step ms | tokens/s | x one GPU | comm hidden | error |\n| --- | ---: | ---: | ---: | ---: | --- |")
    for kind, r in {**doc["one_gpu"], **doc["contenders"]}.items():
        print(f"| {kind} | {r.get('step_ms', '')} | {r.get('tokens_per_s', '')} | {r.get('scaling', '')} | "
              f"{r.get('comm_hidden', '')} | {(r.get('error') or '')[:80]} |")


if __name__ == "__main__":
    main()
