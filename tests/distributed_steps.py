"""Three training steps of a model under thunder's DDP or FSDP, AdamW stepping between them
(parameters change, shards are gathered again), one process per rank (gloo on the CPU, NCCL
on GPUs), and the same steps in one process: what ``tests/test_distributed.py`` compares.
A module of its own, so spawned ranks import it."""

from __future__ import annotations

import os
import re

import torch

MODES = ("ddp", "fsdp-zero2", "fsdp-zero3", "fsdp-zero3-bucketed")
ROWS_PER_RANK = 2


def _model(device, dtype):
    from benchmarks.model_zoo import build

    return build("Llama-3.2-1B", tiny=True, device=device, dtype=dtype)


def _data(built, world: int, device):
    from benchmarks.model_zoo import batch

    return [batch(built, ROWS_PER_RANK * world, 16, device=device, seed=s) for s in (1, 2, 3)]


def _optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2)


def reference(world: int, device="cpu", dtype=torch.float32) -> dict:
    """Eager, one process, the whole batch: each step's loss per rank's rows, and the gradients
    (each rank has as many ignored targets, so the mean over ranks of their mean losses is
    the mean over the batch, and DDP's averaged gradients are the batch's)."""
    built = _model(device, dtype)
    m = built.module
    opt = _optimizer(m.parameters())
    out = {"losses": [], "grads": []}
    for idx, targets in _data(built, world, device):
        loss = m(idx, targets)
        loss.backward()
        with torch.no_grad():
            out["losses"].append([m(idx[r * ROWS_PER_RANK:(r + 1) * ROWS_PER_RANK],
                                    targets[r * ROWS_PER_RANK:(r + 1) * ROWS_PER_RANK]).item() for r in range(world)])
        out["grads"].append({n: p.grad.detach().clone() for n, p in m.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out


def rank_steps(rank: int, world: int, mode: str, port: int, queue, device_type: str = "cpu",
               recommended: bool = True) -> None:
    """One rank: three steps of its rows through thunder + fuser under ``mode``, by the
    README's recommended call (``executors()`` and ``transforms()``, or ``executors()``
    alone where ``recommended`` is False); puts
    (rank, losses, per step the gradients as this rank holds them, traces' facts) on ``queue``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    import torch.distributed as dist

    import thunder_fuser
    import thunder
    from thunder.distributed import FSDPBucketingStrategy, FSDPType, ddp, fsdp

    cuda = device_type == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        dtype = torch.float32
        built = _model(device, dtype)
        m = built.module
        options = dict(executors=thunder_fuser.executors())
        if recommended:  # the README's call: our transforms too
            options["transforms"] = thunder_fuser.transforms()
        if mode == "ddp":
            jm = ddp(thunder.jit(m, **options))
        else:
            strategy = FSDPType.ZERO3 if "zero3" in mode else FSDPType.ZERO2
            bucketing = FSDPBucketingStrategy.BLOCK if "bucketed" in mode else FSDPBucketingStrategy.NONE
            jm = fsdp(thunder.jit(m, **options), device=device, sharding_strategy=strategy,
                      bucketing_strategy=bucketing)
        opt = _optimizer(jm.parameters())
        rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
        losses, grads = [], []
        for idx, targets in _data(built, world, device):
            loss = jm(idx[rows], targets[rows])
            loss.backward()
            losses.append(loss.item())
            # numpy arrays pickle by value: a tensor sent through a queue lives in shared memory
            # that the rank frees when it exits, maybe before the parent has read it
            grads.append({n: p.grad.detach().cpu().numpy().copy() for n, p in jm.named_parameters()})
            opt.step()
            opt.zero_grad(set_to_none=True)
        queue.put((rank, losses, grads, _collectives_outside_regions(jm)))
    except Exception as e:  # noqa: BLE001 - the parent reports it
        import traceback

        queue.put((rank, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}", None))
    finally:
        dist.destroy_process_group()


def _collectives_outside_regions(jm) -> dict:
    """The distributed calls of the last traces, and whether any fuser region claimed one
    (it must not: a collective and its wait stay where thunder's schedule put them)."""
    import thunder
    from thunder.core.prims import PrimIDs  # noqa: F401  (thunder's prims loaded)

    names, inside = [], []
    forward, backward = thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]
    for trace in (forward, backward):
        for b in trace.bound_symbols:
            subs = [s.sym.name for s in b.subsymbols] if b.sym.is_fusion else []
            if any(("all_reduce" in s or "all_gather" in s or "reduce_scatter" in s or s == "wait") for s in subs):
                inside.append(b.sym.name)
            if any(k in b.sym.name for k in ("all_reduce", "all_gather", "reduce_scatter", "wait", "synchronize")):
                names.append(b.sym.name)
    return {"collectives": sorted(set(names)), "claimed_by_a_region": inside, **_overlap_order(forward, backward)}


def _overlap_order(forward, backward) -> dict:
    """What lets NCCL run under compute (``passes/communication_schedule.py``): in the forward,
    nothing but other waits between a wait and its first reader; in the backward, a gradient
    reduced before the last matmul (not every one after it). A launch run's markers
    (``run0_begin``: ``thunder_transforms/launch_runs.py``, CUDA only) are no compute: a wait
    just before the run that reads its result is at its reader."""

    def marker(b) -> bool:
        return re.fullmatch(r"run\d+_begin", b.sym.name) is not None

    def ops(trace):
        return [b for b in trace.bound_symbols if b.sym.name not in ("del", "python_del") and not b.sym.name.startswith("comment")]

    far = []
    fw = ops(forward)
    for i, b in enumerate(fw):
        if b.sym.name.endswith("wait_prim_impl"):
            made = {p.name for p in b.flat_proxy_outs}
            j = i + 1
            while j < len(fw) and not made & {p.name for p in fw[j].flat_proxy_args}:
                if not fw[j].sym.name.endswith("wait_prim_impl") and not marker(fw[j]):
                    far.append(f"{b.sym.name} -> {fw[j].sym.name}")
                    break
                j += 1
    bw = [b.sym.name for b in ops(backward)]
    reduced = [i for i, n in enumerate(bw) if "reduce_scatter" in n or "all_reduce" in n]
    matmuls = [i for i, n in enumerate(bw) if n in ("matmul", "linear") or "matmul" in n]
    return {"waits_far_from_their_reader": far,
            "reduced_before_the_last_matmul": bool(reduced and matmuls and reduced[0] < matmuls[-1])}
