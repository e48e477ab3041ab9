"""Per matmul call of one training step: op, shapes, strides, cuBLAS kernel, GPU us; two contenders side by side."""
import json, os, sys, collections, tempfile
import torch
import thunder_fuser  # noqa
from benchmarks.model_zoo import batch, build
from benchmarks.contenders import wrap
from benchmarks.models import _step, _zero

MM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation", "aten::matmul", "aten::linear"}

def profile_kind(model, layers, kind, b, s):
    torch.manual_seed(0)
    built = build(model, layers, tiny=False, device="cuda", dtype=torch.bfloat16)
    idx, tg = batch(built, b, s, device="cuda")
    fn = wrap(kind, built.module)
    for _ in range(3):
        _zero(built.module); _step(fn, idx, tg)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA], record_shapes=True) as prof:
        _zero(built.module); _step(fn, idx, tg); torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    tr = json.load(open(path))["traceEvents"]
    ops = {}
    for e in tr:
        if e.get("cat") == "cpu_op":
            a = e.get("args", {})
            ops.setdefault(a.get("External id"), []).append(e)
    rows = collections.defaultdict(lambda: [0, 0.0, set()])
    total = 0.0
    for e in tr:
        if e.get("cat") != "kernel":
            continue
        n = e["name"]
        if not (n.startswith("nvjet") or "gemm" in n.lower() or "cutlass" in n.lower() and "fuser" not in n):
            continue
        a = e.get("args", {})
        cands = ops.get(a.get("External id"), [])
        op = min(cands, key=lambda o: o.get("dur", 0)) if cands else None
        key = (op["name"], json.dumps(op["args"].get("Input Dims")), json.dumps(op["args"].get("Input Strides"))) if op else ("?", "", "")
        r = rows[key]; r[0] += 1; r[1] += e["dur"]; r[2].add(n[:60]); total += e["dur"]
    del fn, built
    torch.cuda.empty_cache()
    return rows, total

model, layers = sys.argv[1], int(sys.argv[2])
kinds = sys.argv[3].split(",")
res = {}
for k in kinds:
    rows, total = profile_kind(model, layers, k, 2, 2048)
    res[k] = total
    print(f"=== {model} x{layers} {k}: matmul GPU {total/1000:.3f} ms")
    for key, (c, us, names) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"  {us:8.1f} us {c:3d}x {key[0]:14s} dims={key[1]} strides={key[2]} | {sorted(names)}")
print({k: round(v / 1000, 3) for k, v in res.items()})
