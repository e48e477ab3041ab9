"""The jitted GPT-2 AdamW step's timeline: host issue time, completion, kernel sum vs span, gaps."""
import time, json, tempfile
import torch
import thunder_fuser, thunder
from benchmarks import model_zoo
built = model_zoo.build("hf-GPT2", 12, False, "cuda", torch.bfloat16)
params = [p for p in built.module.parameters()]
for p in params: p.grad = torch.randn_like(p)

def make(kind):
    ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(ps, params): p.grad = q.grad
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, fused=(kind == "fused"))
    step = thunder.jit(opt.step, executors=thunder_fuser.executors()) if kind == "jit" else opt.step
    for _ in range(4): step()
    return step

for kind in ("fused", "jit"):
    step = make(kind)
    torch.cuda.synchronize()
    issue, done = [], []
    for _ in range(20):
        t0 = time.perf_counter(); step(); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        issue.append((t1 - t0) * 1e3); done.append((t2 - t0) * 1e3)
    issue.sort(); done.sort()
    t0 = time.perf_counter()
    for _ in range(50): step()
    torch.cuda.synchronize()
    q = (time.perf_counter() - t0) / 50 * 1e3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize(); step(); torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json"); prof.export_chrome_trace(path)
    ev = json.load(open(path))["traceEvents"]
    ks = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    rt = sorted((e for e in ev if e.get("cat") == "cuda_runtime"), key=lambda e: -e["dur"])[:8]
    span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"] if ks else 0
    print(f"== {kind}: issue median {issue[10]:.3f} ms, done median {done[10]:.3f} ms, queued {q:.3f} ms/step; "
          f"{len(ks)} GPU ops, sum {sum(k['dur'] for k in ks)/1e3:.3f} ms, span {span/1e3:.3f} ms")
    gaps = [(ks[i+1]["ts"] - ks[i]["ts"] - ks[i]["dur"], ks[i]["name"][:50], ks[i+1]["name"][:50]) for i in range(len(ks)-1)]
    for g in sorted(gaps, reverse=True)[:6]: print("   gap", round(g[0], 1), "us", g[1], "->", g[2])
    for k in ks[:40]: print("   ", round(k["dur"], 1), "us", k["name"][:90])
    for r in rt: print("   runtime", r["name"], round(r["dur"], 1), "us")
