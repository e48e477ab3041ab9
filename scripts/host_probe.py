"""Where the host time of one small region call goes (dev aid; run on the GPU machine).

Prints microseconds per call, each from the wall clock of many back-to-back calls, for the
pieces of a region call: thunder's call, our runner (its generated straight-line code,
``runtime/straight_line.py``), the general path (``Plan.run``), the segment's run, the bare
TVM-FFI kernel call, and the torch pieces a call makes (allocation, as_strided), beside one
eager op; last, both paths with the launch replaced by a no-op (our dispatch alone)."""
import thunder_fuser  # noqa: F401
import thunder
import torch
import tvm_ffi

from benchmarks.timing import host_us
from benchmarks.workloads import gelu_bias
from thunder_fuser import fuser_ex
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
    seg = plan.schedule.order[0]
    k = plan.kernels[seg.index]
    part = k.parts[0]
    env = {id(v): a for v, a in zip(plan.region.inputs, args)}
    from thunder_fuser.kernels.geometry import views_for_call
    from thunder_fuser.kernels.segment_kernel import _allocate

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
    rows = [
        ("eager x + 1", lambda: x + 1),
        ("eager gelu(x + b)", lambda: gelu_bias(x, b)),
        ("thunder + fuser call", lambda: j(x, b)),
        ("region runner (straight-line)", lambda: runner(*args)),
        ("general path (plan.run)", lambda: plan.run(args)),
        ("segment kernel run", lambda: k.run(dict(env))),
        ("bare TVM-FFI kernel call", lambda: part.fn(views)),
        # the same launch with its output allocated fresh per call, as the runner's is, and
        # with an allocation beside it that the launch does not use
        ("launch into a fresh output", lambda: part.fn(views_for_call(part.geo, fresh_bases()))),
        ("launch + unused allocation", lambda: (part.fn(views), empty_like_out())),
        ("TVM-FFI no-op, same operands", lambda: nop(views)),
        ("torch.empty_strided", lambda: torch.empty_strided((8, 64), (64, 1), **bf)),
        ("torch.empty", lambda: torch.empty((8, 64), dtype=bf["dtype"], device=dev)),
        ("x.new_empty", lambda: x.new_empty((8, 64))),
        ("one as_strided", lambda: x.as_strided((512,), (1,), 0)),
        ("b.expand", lambda: b.expand(8, 64)),
        ("views_for_call", lambda: views_for_call(part.geo, bases)),
    ]
    print("host us per call")
    for name, fn in rows:
        print(f"  {name:28s} {host_us(fn, (), 2000):7.1f}")
    # our dispatch alone: both paths with the launch replaced by a no-op
    launch, part.fn = part.fn, lambda views: None
    try:
        fast = straight_line(plan, spec_key(args))
        assert runner.fast is not None and fast is not None
        print(f"  {'straight-line, no launch':28s} {host_us(lambda: fast(args), (), 2000):7.1f}")
        print(f"  {'general path, no launch':28s} {host_us(lambda: plan.run(args), (), 2000):7.1f}")
    finally:
        part.fn = launch


if __name__ == "__main__":
    main()
