"""Same-named kernels' GPU time per contender, profiled in alternation (ABCABC): does a CUDA
graph (launch runs) make the same cuBLAS kernels slower?"""
import sys, collections, json
import torch
import thunder_fuser  # noqa
from benchmarks.model_zoo import batch, build
from benchmarks.contenders import wrap
from benchmarks.models import _step, _zero

model, layers, kinds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
setups = {}
for k in kinds:
    torch.manual_seed(0)
    built = build(model, layers, tiny=False, device="cuda", dtype=torch.bfloat16)
    idx, tg = batch(built, 2, 2048, device="cuda")
    fn = wrap(k, built.module)
    for _ in range(4):
        _zero(built.module); _step(fn, idx, tg)
    setups[k] = (built, fn, idx, tg)
torch.cuda.synchronize()

def kind_of(n):
    if n.startswith("nvjet") or "gemm" in n: return "matmul"
    if "sdpa" in n or "flash" in n or "fmha" in n: return "attention"
    if "fuser" in n or "kernel_cutlass" in n: return "ours"
    if "triton" in n: return "triton"
    return "torch"

res = collections.defaultdict(lambda: collections.defaultdict(list))
for rnd in range(2):
    for k in kinds:
        built, fn, idx, tg = setups[k]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                _zero(built.module); _step(fn, idx, tg)
            torch.cuda.synchronize()
        by = collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                by[kind_of(e.name)] += e.device_time / 1000 / 3
        for kk, v in by.items():
            res[k][kk].append(round(v, 3))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            _zero(built.module); _step(fn, idx, tg)
        end.record(); torch.cuda.synchronize()
        res[k]["step_ms"].append(round(start.elapsed_time(end) / 5, 3))
for k in kinds:
    print(f"{k:32s}", {kk: v for kk, v in sorted(res[k].items())})
