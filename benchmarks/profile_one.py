r"""Run one large workload through thunder+fuser a few times, for Nsight Compute.

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:cutlass \
        python -m benchmarks.profile_one "rotate-half + residual bf16"
"""

from __future__ import annotations

import torch

import thunder_fuser  # noqa: F401
import thunder

from benchmarks.suite import cases
from thunder_fuser import fuser_ex


def main(argv=None) -> None:
    from benchmarks import cli

    ap = cli.parser("benchmarks.profile_one", __doc__,
                    epilog="workloads: " + "; ".join(sorted({c.name for c in cases() if c.kind == "large"})))
    ap.add_argument("workload", help="a workload's name, as the suite names it (below)")
    name = ap.parse_args(argv).workload
    cli.require_cuda("benchmarks.profile_one")
    case = next(c for c in cases() if c.name == name and c.kind == "large")
    args = case.make()
    f = thunder.jit(case.fn, executors=[fuser_ex])
    for _ in range(3):
        f(*args)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
