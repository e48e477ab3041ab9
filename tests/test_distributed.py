"""thunder + fuser under thunder's DDP and FSDP, through the README's recommended call
(``executors()`` and ``transforms()``): two ranks, each its own process, train a tiny litgpt
Llama three steps on their rows, AdamW stepping between them; every rank's losses and
gradients must equal one process stepping the whole batch, and no fuser region may claim a
collective or its wait.

The recommended call's transforms are what the GPU met and these tests once left out:
``FastPrologue`` batched the prologue's checks before FSDP's transform gave each sharded
parameter its shard's shape, so every call failed its prologue check (the CPU reproduces it
through gloo: ``expected tensor with (512, 64) ... got (256, 64)``).
The sign-flipped loss NCCL then showed was a kernel's: under FSDP the loss's mask crosses
from one region to another, and CuTe DSL stored its true as the byte 0xFF, read back as
-1.0. The CPU's lowered programs store bools through torch, so gloo cannot see that class;
``test_a_bool_is_stored_as_torchs_byte_1_by_every_family`` (PTX, CPU) does.
The same runs check the order that lets NCCL run under compute: in the forward no op but
another wait between a wait and its first reader, and in the backward a gradient reduced
before the last matmul (``passes/communication_schedule.py``; before it, every wait came
before the first layer and every reduce-scatter after the last matmul).
On the CPU through gloo (CI); on two GPUs through NCCL (``cuda``, where a machine has two).

thunder's own distributed suites (``thunder/tests/distributed``) run only on CUDA with NCCL and
two GPUs (each test class is ``skipUnless`` so, and its tests place tensors on
``cuda:rank``), so on the CPU they have nothing to run.
"""

from __future__ import annotations

import socket

import pytest
import torch

import distributed_steps

pytest.importorskip("litgpt")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(mode: str, device_type: str) -> list:
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=distributed_steps.rank_steps, args=(r, WORLD, mode, port, queue, device_type))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        results = sorted((queue.get(timeout=900) for _ in procs), key=lambda r: r[0])
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for rank, losses, grads, _ in results:
        assert losses is not None, f"rank {rank} failed: {grads}"
    return results


def _shard(full: torch.Tensor, rank: int) -> torch.Tensor:
    """Rank ``rank``'s FSDP shard of ``full``: dim 0 padded to a multiple of the world, then cut."""
    rows = -(-full.shape[0] // WORLD)
    padded = torch.zeros((rows * WORLD, *full.shape[1:]), dtype=full.dtype)
    padded[:full.shape[0]] = full
    return padded[rank * rows:(rank + 1) * rows]


def _check(mode: str, device_type: str) -> None:
    ref = distributed_steps.reference(WORLD)
    for rank, losses, grads, facts in _run_ranks(mode, device_type):
        assert facts["claimed_by_a_region"] == [], facts
        assert facts["collectives"], f"{mode}: no collective in the traces"
        assert facts["waits_far_from_their_reader"] == [], facts  # NCCL's time under compute
        assert facts["reduced_before_the_last_matmul"], facts
        for step, (loss, want) in enumerate(zip(losses, ref["losses"])):
            assert abs(loss - want[rank]) < 1e-4, f"{mode} rank {rank} step {step}: loss {loss} against {want[rank]}"
        for step, (got, want) in enumerate(zip(grads, ref["grads"])):
            assert set(got) == set(want), (sorted(got), sorted(want))
            for name, g in got.items():
                g = torch.from_numpy(g)
                w = want[name] if mode == "ddp" else _shard(want[name], rank)
                assert g.shape == w.shape, (name, g.shape, w.shape)
                err = ((g - w).norm() / (w.norm() + 1e-12)).item()
                assert err < 1e-4, f"{mode} rank {rank} step {step}: gradient of {name} off by {err:.2e}"


@pytest.mark.parametrize("mode", distributed_steps.MODES)
def test_two_ranks_step_as_one_process_on_gloo(mode, torch_kernels):
    """CPU, gloo: DDP, FSDP ZERO2, ZERO3 and ZERO3 with block bucketing, three steps (AdamW
    between them), each rank's losses and gradients against one process."""
    _check(mode, "cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("mode", distributed_steps.MODES)
def test_two_ranks_step_as_one_process_on_nccl(mode):
    _check(mode, "cuda")
