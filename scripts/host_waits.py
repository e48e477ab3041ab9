"""Where a zoo training step's host waits for the GPU (GPU machine): every synchronizing
CUDA runtime call and every host-to-device copy, with the Python stack that made it.

A copy from pageable host memory makes the host wait until the stream reaches it, so the
host stops queueing work while the GPU drains; work the host issues after it (an optimizer
step's host part, the next step's forward) then lies on the step's critical path. The zoo
listed three ``Memcpy HtoD (Pageable -> Device)`` in each thunder+fuser+jitstep step of
Llama-3.2-1B and none in thunder+fuser's, and that contender's wall-clock gain over torch's
fused AdamW (1.1 ms) stayed below its GPU-time gain (2.7 ms).

    python scripts/host_waits.py [--model Llama-3.2-1B] [--layers 1] [--kinds thunder+fuser+jitstep,thunder+fuser]
"""

from __future__ import annotations

import argparse

import torch

import thunder_fuser  # noqa: F401  (torch compat stubs before thunder)
from benchmarks.model_zoo import batch, build
from benchmarks.zoo import Trainer

WAITS = ("cudaMemcpy", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="Llama-3.2-1B")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--kinds", default="thunder+fuser+jitstep,thunder+fuser")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    for kind in a.kinds.split(","):
        built = build(a.model, a.layers, tiny=not cuda, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
        idx, targets = batch(built, 2, 2048 if cuda else 16, device=device)
        trainer = Trainer(kind, built.module)
        for _ in range(4):
            trainer.step(idx, targets)
        if cuda:
            torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities, with_stack=True) as prof:
            trainer.step(idx, targets)
            if cuda:
                torch.cuda.synchronize()
        waits = 0
        for fe in prof.events():
            if fe.device_type != torch.autograd.DeviceType.CPU:
                continue
            copies = [k.name for k in fe.kernels if "Memcpy HtoD" in k.name]
            if fe.name in WAITS or copies:
                waits += 1
                stack = [s for s in (fe.stack or []) if "site-packages/torch" not in s][:8]
                print(f"{kind}: {fe.name} {fe.cpu_time_total:.1f} us {copies}\n    " + "\n    ".join(stack))
        print(f"{kind}: {waits} host waits or host-to-device copies in one step")
        del trainer, built
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
