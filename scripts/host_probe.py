"""Where the host time of one small region call goes (dev aid; run on the GPU machine).

Prints microseconds per call for the pieces of a region call: thunder's call, our runner
(its generated straight-line code, ``runtime/straight_line.py``; the same code with the
kernel as CuTe DSL's compiled object, as before ``cache.direct_function``, and with the
launch a no-op: our dispatch alone), the general path (``Plan.run``), the segment's run,
the bare TVM-FFI kernel call, and the torch pieces a call makes (allocation, as_strided),
beside eager ops. The rows take turns (``host_us_interleaved``): the host's speed moves
from minute to minute. Each row is timed drained (the wall clock of many calls and the wait
for them); a few again as issued (256 calls timed before the wait): tiny kernels drain at
the GPU's rate, which can be above the host's cost of issuing them. Last, the floor under
any launch from this host: an empty kernel launched from C (``cudaLaunchKernel``, and
``cudaLaunchKernelExC`` with the attributes CuTe DSL sets), drained and issued, where nvcc
is there."""
import os
import subprocess
import tempfile
import time

import thunder_fuser  # noqa: F401
import thunder
import torch
import tvm_ffi

from benchmarks.timing import host_us_interleaved
from benchmarks.workloads import gelu_bias
from thunder_fuser import fuser_ex
from thunder_fuser.backends.cute import cache, segment_kernel
from thunder_fuser.runtime.plan import spec_key
from thunder_fuser.runtime.region_runner import RegionRunner
from thunder_fuser.runtime.straight_line import straight_line


def main():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, b = torch.randn(8, 64, **bf), torch.randn(64, **bf)
    seen = []
    orig = RegionRunner.__call__

    def rec(self, *a):
        seen.append((self, a))
        return orig(self, *a)

    RegionRunner.__call__ = rec
    j = thunder.jit(gelu_bias, executors=[fuser_ex])
    j(x, b)
    j(x, b)  # the second call runs the straight-line code written after the first
    RegionRunner.__call__ = orig
    runner, args = seen[-1]
    plan = runner.plan_for(args)
    seg = plan.decision.schedule.order[0]
    k = plan.kernels[seg.index]
    part = k.parts[0]
    env = {id(v): a for v, a in zip(plan.decision.region.inputs, args)}
    from thunder_fuser.backends.cute.tiling.base_maps import views_for_call
    from thunder_fuser.backends.cute.segment_kernel import _allocate

    stores = _allocate(part.store_recipe, env, k.device)
    bases = [stores[i] if from_store else env[i] for from_store, i in part.base_refs]
    views = views_for_call(part.geo, bases)
    dev = x.device
    out_slot = next(i for i, (from_store, _) in enumerate(part.base_refs) if from_store)

    def empty_like_out():
        o = bases[out_slot]
        return torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=dev)

    def fresh_bases():
        return [empty_like_out() if i == out_slot else b for i, b in enumerate(bases)]

    nop = tvm_ffi.get_global_func("testing.nop")  # the FFI crossing alone, no launch
    # the same kernel as CuTe DSL's compiled object returns it (its Python wrappers), beside
    # the TVM-FFI function a plan calls (``cache.direct_function``)
    direct, cache.direct_function = cache.direct_function, lambda c: c
    os.environ["THUNDER_FUSER_DISK_CACHE"] = "0"
    cache.clear_memory()
    wrapped = segment_kernel.compile_program(part.prog, part.geo, dev)
    cache.direct_function = direct
    unwrapped = direct(wrapped)
    out_view = bases[out_slot]
    launch = part.fn

    def straight_line_with(fn):
        """The runner's code written with ``fn`` as the kernel (the code holds it as a constant)."""
        part.fn = fn
        try:
            return straight_line(plan, spec_key(args))
        finally:
            part.fn = launch

    fast_wrapped = straight_line_with(wrapped)  # as before ``cache.direct_function``
    fast_nop = straight_line_with(lambda views: None)  # our dispatch alone
    assert runner.fast is not None and fast_wrapped is not None and fast_nop is not None
    rows = {
        "eager x + 1": lambda: x + 1,
        "eager gelu(x + b)": lambda: gelu_bias(x, b),
        "eager out.add_(1), in place": lambda: out_view.add_(1),
        "thunder + fuser call": lambda: j(x, b),
        "region runner (straight-line)": lambda: runner(*args),
        "  its straight-line code alone": lambda: runner.fast(args),
        "  ... kernel as CuTe DSL object": lambda: fast_wrapped(args),
        "  ... launch a no-op": lambda: fast_nop(args),
        "general path (plan.run)": lambda: plan.run(args),
        "segment kernel run": lambda: k.run(dict(env)),
        f"bare kernel call ({type(launch).__name__})": lambda: launch(views),
        "  CuTe DSL's compiled object": lambda: wrapped(views),
        "  its TVM-FFI function": lambda: unwrapped(views),
        # the same launch with its output allocated fresh per call, as the runner's is, and
        # with an allocation beside it that the launch does not use
        "launch into a fresh output": lambda: launch(views_for_call(part.geo, fresh_bases())),
        "launch + unused allocation": lambda: (launch(views), empty_like_out()),
        "TVM-FFI no-op, same operands": lambda: nop(views),
        "torch.cuda._sleep(0)": lambda: torch.cuda._sleep(0),
        "torch.empty_strided": lambda: torch.empty_strided((8, 64), (64, 1), **bf),
        "torch.empty": lambda: torch.empty((8, 64), dtype=bf["dtype"], device=dev),
        "x.new_empty": lambda: x.new_empty((8, 64)),
        "one as_strided": lambda: x.as_strided((512,), (1,), 0),
        "b.expand": lambda: b.expand(8, 64),
        "views_for_call": lambda: views_for_call(part.geo, bases),
    }
    us = host_us_interleaved(rows)
    print("host us per call (least / median of 15 turns of 500 calls, the rows taking turns)")
    for name, (least, median) in us.items():
        print(f"  {name:32s} {least:6.1f} {median:6.1f}")
    print("issued: 256 calls timed before the wait for them (the host's cost alone)")
    for name in ("eager x + 1", "region runner (straight-line)", f"bare kernel call ({type(launch).__name__})",
                 "torch.cuda._sleep(0)"):
        print(f"  {name:32s} {issue_us(rows[name]):6.1f}")
    for name, floor in launch_floor():
        print(f"  {name:32s} {floor:6.1f}")
    runner_us, eager_us = us["region runner (straight-line)"][0], us["eager x + 1"][0]
    print(f"region runner {runner_us:.1f} us = {runner_us / eager_us:.2f} x eager x + 1 ({eager_us:.1f} us)")


def issue_us(fn, calls: int = 256, reps: int = 40) -> float:
    """Least microseconds per call to issue ``calls`` calls, timed before waiting for the
    GPU (fewer than its launch queue holds): the host's cost without the GPU's rate."""
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return best


_FLOOR = r"""
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(float *p) { if (p && threadIdx.x == 1024) p[0] = 1; }
int main() {
  const int n = 20000;
  float *p = nullptr;
  void *args[] = {&p};
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 0;
  at[1].id = cudaLaunchAttributeCooperative; at[1].val.cooperative = 0;
  cudaLaunchConfig_t cfg = {dim3(8), dim3(64), 0, 0, at, 2};
  // drained: the wall clock of n launches and the wait for them (the GPU's rate bounds it);
  // issued: 256 launches, timed before the wait (the host's own cost of a launch)
  for (int mode = 0; mode < 4; ++mode) {
    int count = mode < 2 ? n : 256;
    double best = 1e30;
    for (int rep = 0; rep < (mode < 2 ? 4 : 40); ++rep) {
      cudaDeviceSynchronize();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < count; ++i) {
        if (mode % 2 == 0) k<<<8, 64>>>(p);
        else cudaLaunchKernelExC(&cfg, (const void *)k, args);
      }
      if (mode < 2) cudaDeviceSynchronize();
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / count;
      if (rep && us < best) best = us;
    }
    if (cudaGetLastError() != cudaSuccess) return 1;
    printf("%s,%s %.2f\n", mode % 2 ? "cudaLaunchKernelExC" : "cudaLaunchKernel", mode < 2 ? "drained" : "issued", best);
  }
}
"""


def launch_floor() -> list:
    """(name, us) of one launch of an empty kernel from C, or nothing without nvcc."""
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "floor.cu"), os.path.join(d, "floor")
        with open(src, "w") as f:
            f.write(_FLOOR)
        try:
            subprocess.run(["nvcc", "-O2", "-arch=native", src, "-o", exe], check=True, capture_output=True, timeout=120)
            out = subprocess.run([exe], check=True, capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as e:
            return [(f"C launch floor: {type(e).__name__}", float("nan"))]
    return [(f"C {name.replace(',', ', ')}", float(us)) for name, us in (line.split() for line in out.splitlines())]


if __name__ == "__main__":
    main()
