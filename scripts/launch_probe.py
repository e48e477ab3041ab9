"""Where a kernel launch's host time goes in a training step (GPU machine): every launch of
one thunder + fuser step, replayed alone (the time to issue 200 calls, the least of 3
turns, the variants taking turns), with its torch tensors as they are, pre-converted to
TVM-FFI tensors (``tvm_ffi.from_dlpack``), and its tuples pre-converted to TVM-FFI arrays;
the conversions alone last. The difference between the first and the others is TVM-FFI's
conversion; what remains is CuTe DSL's launch wrapper and CUDA's.

    python scripts/launch_probe.py [pythia-410m]

Session 34, one H100 host, pythia (200 calls each, one variant after the other): 33
launches in 24 region calls, 282 us a step, 241 with tensors pre-converted, 226 with whole
arrays (so conversion is 41-56 us of it); a launch 4.3-6 us with 2-3 tensors, 7-8 us with
8-13, and 9-12 us for most of the backward's (some of them two launches, a column
reduction and its partials: not checked one by one). On another host, as the script now
times: 197 us, 168 and 158 converted beforehand, 3.5-5.5 us a launch, about 7 us for those.
"""
import sys

import torch

if not torch.cuda.is_available():
    sys.exit("launch_probe.py needs a CUDA device (it replays CuTe DSL launches)")
import thunder_fuser  # noqa: E402,F401  (before thunder)
import tvm_ffi  # noqa: E402

from benchmarks.contenders import wrap
from benchmarks.model_zoo import batch, build
from benchmarks.models import _step, _zero
from benchmarks.timing import host_us_interleaved
from thunder_fuser.runtime import region_runner as rr


def record_launches(name: str) -> tuple[list, int]:
    """(region, kernel name, launch function, its arguments) for each launch of one step."""
    built = build(name, 2, tiny=False, device="cuda", dtype=torch.bfloat16)
    idx, targets = batch(built, 2, 1024, device="cuda")
    fn = wrap("thunder+fuser no-region-graphs", built.module)  # each launch timed: no region graphs
    for _ in range(4):
        _zero(built.module)
        _step(fn, idx, targets)
    torch.cuda.synchronize()
    runners = []
    call = rr.RegionRunner.__call__

    def note(self, *args):
        if self not in runners:
            runners.append(self)
        return call(self, *args)

    rr.RegionRunner.__call__ = note
    _zero(built.module)
    _step(fn, idx, targets)
    rr.RegionRunner.__call__ = call
    launches, saved = [], []
    for r in runners:
        g = r.fast.__globals__ if r.fast is not None else {}
        for k, v in list(g.items()):
            if k.startswith(("kernel", "group")):
                def launch(*a, _v=v, _k=k, _r=r.__name__):
                    launches.append((_r, _k, _v, a))
                    return _v(*a)

                g[k] = launch
                saved.append((g, k, v))
    _zero(built.module)
    _step(fn, idx, targets)
    torch.cuda.synchronize()
    for g, k, v in saved:
        g[k] = v
    return launches, len(runners)


def tensors(x) -> int:
    if isinstance(x, torch.Tensor):
        return 1
    return sum(tensors(y) for y in x) if isinstance(x, (tuple, list)) else 0


def converted(x):
    if isinstance(x, torch.Tensor):
        return tvm_ffi.from_dlpack(x)
    return tuple(converted(y) for y in x) if isinstance(x, tuple) else x


def main() -> None:
    launches, calls = record_launches(sys.argv[1] if len(sys.argv) > 1 else "pythia-410m")
    rows = []
    for region, kernel, f, a in launches:
        pre = tuple(converted(x) for x in a)
        arrays = tuple(tvm_ffi.convert(x) if isinstance(x, tuple) else x for x in pre)
        us = host_us_interleaved({"torch": lambda: f(*a), "ffi": lambda: f(*pre), "arrays": lambda: f(*arrays),
                                  "conversions": lambda: tuple(converted(x) for x in a)}, calls=200, rounds=3,
                                 issue_only=True)
        rows.append((region, kernel, tensors(a), *(us[k][0] for k in ("torch", "ffi", "arrays", "conversions"))))
    print(f"{len(launches)} launches in {calls} region calls")
    print("| region | kernel | tensors | torch tensors us | ffi tensors us | ffi arrays us | conversions us |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print("| %s | %s | %d | %.1f | %.1f | %.1f | %.1f |" % row)
    total = [sum(r[i] for r in rows) for i in (3, 4, 5, 6)]
    print("a step, us: torch tensors %.0f, ffi tensors %.0f, ffi arrays %.0f, conversions %.0f; %d tensors"
          % (*total, sum(r[2] for r in rows)))
    x = torch.empty(1024, device="cuda")
    us = host_us_interleaved({"empty_like": lambda: torch.empty_like(x), "add_": lambda: x.add_(1),
                              "data_ptr": lambda: x.data_ptr()}, calls=200, rounds=3, issue_only=True)
    print("beside them, us: torch.empty_like %.1f, x.add_(1) %.1f, x.data_ptr() %.2f"
          % tuple(us[k][0] for k in ("empty_like", "add_", "data_ptr")))


if __name__ == "__main__":
    main()
