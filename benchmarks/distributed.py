"""Training steps on several GPUs: tokens/s per contender, scaling from one GPU, how much of
the communication runs under compute, memory per GPU, and each step's loss against thunder's
own executors.

    python -m benchmarks.distributed --out DIR [--model Llama-3.2-1B --layers 16 --seq 2048]

Spawns one process per GPU (NCCL; on a machine without GPUs, two CPU processes over gloo: the
harness's smoke test, whose timings mean nothing). Contenders, each sharding its parameters:
thunder + fuser under ``thunder.distributed.fsdp`` (ZERO2 and ZERO3, the README's recommended
call), thunder with its default executors under the same (ZERO3), and torch.compile of the
model wrapped in PyTorch's FSDP2 (``fully_shard`` per block). Every step runs AdamW over the
rank's parameters (``--optimizer none``: gradients only). Each rank steps its own rows
(``--batch`` per rank, seeded by rank, the same for every contender); step time is the median
over ``--steps`` steps; one step runs under torch.profiler, and on GPUs the fraction of the
NCCL kernels' time that overlaps a compute kernel on the device timeline is "hidden". Peak is
the most memory allocated on rank 0 during the timed steps; held is what stays allocated
between steps. One-process runs of thunder + fuser and torch.compile give the scaling (a
model one GPU cannot hold records the out-of-memory error there). ``floor: 1 GPU step + NCCL
beside`` (GPUs only) bounds what any overlap could give: each rank steps the unsharded model
while ZERO3's collectives run on a second stream, nothing waiting for them (``_TrafficBeside``).
Writes ``distributed.json`` and prints a table last.
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

CONTENDERS = ("thunder+fuser zero2", "thunder+fuser zero3", "thunder zero3", "torch.compile + FSDP2")
ONE_GPU = ("thunder+fuser 1 GPU", "torch.compile 1 GPU")
# Not a contender: each rank steps the whole unsharded model (thunder + fuser, one GPU's step)
# while a second stream moves what ZERO3 moves (every parameter's all-gather and reduce-scatter,
# no bucketing), neither waiting for the other. No schedule of ZERO3 overlaps better, so its
# step, less the half of AdamW's work that a ZERO3 rank does not do, is the floor of ZERO3's step.
FLOOR = "floor: 1 GPU step + NCCL beside"
LOSS_STEPS = 3  # the warm-up steps whose losses every contender records


def _wrap(kind: str, module, device, bucketing: str = "none"):
    import thunder
    from thunder.distributed import FSDPBucketingStrategy, FSDPType, fsdp

    from benchmarks.contenders import thunder_executors, thunder_transforms

    if kind == FLOOR:
        kind = "thunder+fuser 1 GPU"
    if kind.startswith("torch.compile"):
        if kind.endswith("FSDP2"):
            from torch.distributed.fsdp import fully_shard

            for block in module.model.transformer.h:
                fully_shard(block)
            fully_shard(module)
        return torch.compile(module)
    jm = thunder.jit(module, executors=thunder_executors(kind), transforms=thunder_transforms(kind))
    if kind.endswith("1 GPU"):
        return jm
    strategy = FSDPType.ZERO2 if kind.endswith("zero2") else FSDPType.ZERO3
    return fsdp(jm, device=device, sharding_strategy=strategy,
                bucketing_strategy=getattr(FSDPBucketingStrategy, bucketing.upper()))


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(spans: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """The time of ``spans`` (disjoint, sorted) that ``cover`` (disjoint, sorted) also covers."""
    total, j = 0.0, 0
    for a, b in spans:
        while j < len(cover) and cover[j][1] <= a:
            j += 1
        k = j
        while k < len(cover) and cover[k][0] < b:
            total += min(b, cover[k][1]) - max(a, cover[k][0])
            k += 1
    return total


def _comm_profile(prof) -> dict:
    """Of one profiled step's device timeline (ms): the time some compute kernel runs, the
    time some NCCL kernel runs, and the NCCL time no compute kernel covers (exposed); hidden
    is the NCCL time under compute over the NCCL time."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    comm = _union([(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()])
    work = _union([(e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower()])
    comm_us = sum(b - a for a, b in comm)
    under = _overlap(comm, work)
    return {"comm_hidden": round(under / comm_us, 3) if comm_us else None, "comm_ms": round(comm_us / 1000, 2),
            "comm_exposed_ms": round((comm_us - under) / 1000, 2),
            "compute_busy_ms": round(sum(b - a for a, b in work) / 1000, 2)}


class _TrafficBeside:
    """ZERO3's collectives for ``params`` (an all-gather and a reduce-scatter of each, bf16, one
    per parameter as thunder issues them unbucketed) on a stream of their own: ``start`` queues
    them behind what the current stream has queued, ``join`` makes the current stream wait."""

    def __init__(self, params, world: int):
        self.on = True  # off: ``start`` queues nothing (the same step without the traffic)
        self.stream = torch.cuda.Stream()
        self.bufs = []
        for p in params:
            n = -(-p.numel() // world)
            shard = torch.zeros(n, dtype=p.dtype, device=p.device)
            self.bufs.append((shard, torch.zeros(n * world, dtype=p.dtype, device=p.device)))

    def start(self) -> None:
        import torch.distributed as dist

        if not self.on:
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for shard, full in self.bufs:
                dist.all_gather_into_tensor(full, shard)
            for shard, full in self.bufs:
                dist.reduce_scatter_tensor(shard, full)

    def join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.stream)


def _median_ms(fn, n: int = 5, cuda: bool = True) -> float:
    """The median of ``n`` calls of ``fn``, each from an idle GPU to an idle GPU (``cuda``)."""
    times = []
    for _ in range(n):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _floor_parts(step, backward, beside: _TrafficBeside, opt, world: int) -> dict:
    """The floor's parts, each timed alone in this process: the traffic, AdamW's step over the
    whole model (its gradients made by ``backward`` first), the step without the traffic; and
    the floor of ZERO3's step (this step less the AdamW work ZERO3 shards away)."""
    nccl = _median_ms(lambda: (beside.start(), beside.join()))
    adamw = 0.0
    if opt is not None:
        backward()
        adamw = _median_ms(opt.step)
        opt.zero_grad(set_to_none=True)
    beside.on = False
    alone = _median_ms(step)
    beside.on = True
    floor = _median_ms(step) - adamw * (world - 1) / world
    return {"nccl_alone_ms": round(nccl, 2), "adamw_ms": round(adamw, 2), "step_without_nccl_ms": round(alone, 2),
            "zero3_floor_ms": round(floor, 2)}


def _rank(rank: int, world: int, port: int, a, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    import torch.distributed as dist

    import thunder_fuser  # noqa: F401
    from benchmarks.model_zoo import batch, build
    from benchmarks.models import _step

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    kinds = a.contenders if world > 1 else a.one_gpu
    out = {}
    for kind in kinds:
        r = {"error": None}
        try:
            built = build(a.model, a.layers, tiny=not cuda, device=device, dtype=torch.bfloat16 if cuda else torch.float32,
                          made_on_device=True)
            idx, targets = batch(built, a.batch, a.seq if cuda else 16, device=device, seed=1 + rank)
            fn = _wrap(kind, built.module, device, a.bucketing)
            params = list(fn.parameters())
            opt = torch.optim.AdamW(params, lr=1e-5) if a.optimizer == "adamw" else None
            if kind == FLOOR and not cuda:
                raise RuntimeError("the floor needs CUDA streams and NCCL")
            beside = _TrafficBeside(params, world) if kind == FLOOR else None

            def step():
                if beside is not None:
                    beside.start()
                loss = _step(fn, idx, targets)
                if opt is not None:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                else:
                    for p in params:
                        p.grad = None
                if beside is not None:
                    beside.join()
                return loss

            t0 = time.perf_counter()
            r["losses"] = [round(step().item(), 5)]
            r["first_step_s"] = round(time.perf_counter() - t0, 1)
            r["losses"] += [round(step().item(), 5) for _ in range(LOSS_STEPS - 1)]
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            ms = _median_ms(step, a.steps, cuda)
            r.update(step_ms=round(ms, 3), tokens_per_s=round(idx.numel() * world / ms * 1000))
            r["tokens_per_s_per_gpu"] = round(r["tokens_per_s"] / world)
            if cuda:
                r["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                r["held_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    torch.cuda.synchronize()
                r.update(_comm_profile(prof))
                if beside is not None:
                    r.update(_floor_parts(step, lambda: _step(fn, idx, targets), beside, opt, world))
        except Exception as e:  # noqa: BLE001 - a failing contender is reported
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        out[kind] = r
        if rank == 0:
            print(f"[{world} rank(s)] {kind}: {r}", flush=True)
            with open(os.path.join(a.out, "distributed.partial.jsonl"), "a") as f:  # what a timed-out run keeps
                f.write(json.dumps({"world": world, "kind": kind, **r}) + "\n")
        fn = opt = params = built = None
        torch._dynamo.reset()
        if cuda:
            torch.cuda.empty_cache()
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
    ap = cli.parser("benchmarks.distributed", __doc__, epilog=f"contenders: {', '.join(CONTENDERS)}, {FLOOR}; one GPU: {', '.join(ONE_GPU)}\n"
                    "Without a CUDA GPU two CPU processes step over gloo (a smoke test).")
    ap.add_argument("--out", default="benchmarks/results", help="folder for distributed.json")
    ap.add_argument("--model", default="Llama-3.2-1B", help="the litgpt model (benchmarks.model_zoo names)")
    ap.add_argument("--layers", type=int, default=16, help="transformer layers")
    ap.add_argument("--batch", type=int, default=2, help="rows per rank")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per row")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per contender")
    ap.add_argument("--optimizer", choices=("adamw", "none"), default="adamw", help="the step after each backward")
    ap.add_argument("--bucketing", choices=("none", "layer", "block"), default="none",
                    help="thunder's FSDP bucketing: a collective per parameter, per layer or per transformer block")
    ap.add_argument("--contenders", type=lambda v: tuple(v.split(",")), default=CONTENDERS,
                    help="comma-separated, of the contenders below")
    ap.add_argument("--one-gpu", type=lambda v: tuple(x for x in v.split(",") if x), default=ONE_GPU,
                    help="comma-separated one-process runs for the scaling (empty: none)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    world = torch.cuda.device_count() if torch.cuda.is_available() else 2
    doc = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (gloo: a smoke test)",
           "world": world, "model": a.model, "layers": a.layers, "rows_per_rank": a.batch, "seq": a.seq,
           "optimizer": a.optimizer, "bucketing": a.bucketing, "one_gpu": _launch(1, a) if a.one_gpu else {},
           "contenders": _launch(world, a) if world > 1 and a.contenders else {}}
    one = doc["one_gpu"].get("thunder+fuser 1 GPU", {}).get("tokens_per_s")
    ref = doc["contenders"].get("thunder zero3", {}).get("losses")
    for r in doc["contenders"].values():
        if one and r.get("tokens_per_s"):
            r["scaling"] = round(r["tokens_per_s"] / one, 2)
        if ref and r.get("losses"):  # bf16: a step's loss within 2% of thunder's own executors'
            r["losses_match_thunder"] = all(abs(x - y) <= 0.02 * max(1.0, abs(y)) for x, y in zip(r["losses"], ref))
    with open(os.path.join(a.out, "distributed.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(table(doc))


def table(doc: dict) -> str:
    """The results of ``distributed.json`` as a markdown table."""
    lines = ["| contender | step ms | tokens/s per GPU | x one GPU | comm hidden | compute busy ms | NCCL ms | "
             "NCCL exposed ms | peak GiB | held GiB | losses | = thunder's | error |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    for kind, r in {**doc["one_gpu"], **doc["contenders"]}.items():
        lines.append(f"| {kind} | {r.get('step_ms', '')} | {r.get('tokens_per_s_per_gpu', '')} | {r.get('scaling', '')} | "
                     f"{r.get('comm_hidden', '')} | {r.get('compute_busy_ms', '')} | {r.get('comm_ms', '')} | "
                     f"{r.get('comm_exposed_ms', '')} | {r.get('peak_gib', '')} | {r.get('held_gib', '')} | "
                     f"{r.get('losses', '')} | {r.get('losses_match_thunder', '')} | {(r.get('error') or '')[:80]} |")
    floor = doc["contenders"].get(FLOOR, {})
    if floor.get("zero3_floor_ms"):
        lines += ["", f"{FLOOR}: the whole model's step on each GPU with ZERO3's NCCL traffic on a second stream, "
                  f"nothing waiting for it. Alone in this run: the step {floor['step_without_nccl_ms']} ms, the traffic "
                  f"{floor['nccl_alone_ms']} ms, AdamW over the whole model {floor['adamw_ms']} ms. Together, less the AdamW "
                  f"work ZERO3 shards away: **{floor['zero3_floor_ms']} ms, the floor of ZERO3's step** on this model "
                  "(no schedule overlaps more than nothing waiting at all)."]
    return "\n".join(lines)

if __name__ == "__main__":
    main()
