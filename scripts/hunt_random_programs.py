"""Hunt with the random attack programs (``tests/attack_programs.py``) for a while, without
shrinking: each failure is printed as a program to paste and run, one per kind of error.

    python scripts/hunt_random_programs.py --device cuda --examples 1000 --seconds 500

On a GPU every example runs on generated kernels; ``--lowered`` runs the lowered kernel
programs with torch on the CPU. The pytest properties (``tests/test_random_programs.py``)
shrink a failure to its smallest program but stop at the first; this counts them all."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--examples", type=int, default=500, help="programs to run (default: 500)")
    p.add_argument("--seconds", type=float, default=600, help="stop drawing after this long (default: 600)")
    p.add_argument("--grads", action="store_true", help="programs without in-place writes, gradients compared")
    p.add_argument("--lowered", action="store_true", help="THUNDER_FUSER_KERNELS=torch (the CPU's stand-in for kernels)")
    p.add_argument("--index64", action="store_true", help="pointwise kernels in their 64-bit variant at every size "
                   "(the bound of geometry.needs_64bit_indices lowered; row kernels then leave such segments to torch)")
    args = p.parse_args()
    if args.lowered:
        os.environ["THUNDER_FUSER_KERNELS"] = "torch"
    os.environ.setdefault("THUNDER_FUSER_COMPILE_WORKERS", "0")  # a kernel from the first call on

    import conftest  # noqa: F401  (thunder_fuser before thunder; the kept PTX out of the checkout)
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import UnsatisfiedAssumption

    from attack_programs import attack_programs
    if args.index64:
        from thunder_fuser.backends.cute.tiling import geometry
        geometry.INT32_LIMIT = 16
    from test_random_programs import check_program

    failures: list = []
    seen: set = set()
    ran = [0]
    start = time.time()

    class OutOfTime(BaseException):
        """Not an ``Exception``: hypothesis lets it through at once instead of drawing on."""

    @settings(max_examples=args.examples, phases=[Phase.generate], deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(attack_programs(grads=args.grads))
    def run(program):
        if time.time() - start > args.seconds:
            raise OutOfTime
        ran[0] += 1
        try:
            check_program(program, args.device)
        except UnsatisfiedAssumption:
            raise  # thunder's own failure (``test_random_programs._unless_thunders_own``): drawn again
        except Exception as e:  # noqa: BLE001 - every failure is counted; each new kind is shown at once
            failures.append((program, e))
            kind = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            if kind not in seen:
                seen.add(kind)
                print("=" * 72, repr(program), kind, sep="\n", flush=True)
        if ran[0] % 100 == 0:
            print(f"{ran[0]} programs, {len(failures)} failures, {time.time() - start:.0f} s", flush=True)

    try:
        run()
    except OutOfTime:
        pass
    print(f"{args.device}{' lowered' if args.lowered else ''}{' grads' if args.grads else ''}{' index64' if args.index64 else ''}: "
          f"{ran[0]} programs, {len(failures)} failures ({len(seen)} kinds), {time.time() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
