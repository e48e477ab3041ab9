"""Run one large workload through thunder+fuser a few times, for Nsight Compute.

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:cutlass \
        python -m benchmarks.profile_one "rotate-half + residual bf16"
"""

from __future__ import annotations

import sys

import torch

import thunder_fuser  # noqa: F401
import thunder

from benchmarks.suite import cases
from thunder_fuser import fuser_ex


def main(name: str) -> None:
    case = next(c for c in cases() if c.name == name and c.kind == "large")
    args = case.make()
    f = thunder.jit(case.fn, executors=[fuser_ex])
    for _ in range(3):
        f(*args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
