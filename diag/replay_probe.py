"""Where the jitted GPT-2 AdamW step's host time goes: each graph replay's host time, the update call's, the step's."""
import time, statistics
import torch
import thunder_fuser, thunder
from benchmarks import model_zoo
from thunder_fuser.optimizers import jitted_step as js
built = model_zoo.build("hf-GPT2", 12, False, "cuda", torch.bfloat16)
params = [p for p in built.module.parameters()]
for p in params: p.grad = torch.randn_like(p)
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
step = thunder.jit(opt.step, executors=thunder_fuser.executors())
for _ in range(4): step()
rec = {"replay": [], "update": [], "group_call": [], "count": []}
orig_replay = torch.cuda.CUDAGraph.replay
def replay(self):
    t0 = time.perf_counter(); orig_replay(self); rec["replay"].append(time.perf_counter() - t0)
torch.cuda.CUDAGraph.replay = replay
upd = step.update
def update(*a, **k):
    t0 = time.perf_counter(); r = upd(*a, **k); rec["update"].append(time.perf_counter() - t0); return r
step.update = update
gc = step._group_call
def group_call(g):
    t0 = time.perf_counter(); r = gc(g); rec["group_call"].append(time.perf_counter() - t0); return r
step._group_call = group_call
torch.cuda.synchronize()
tot = []
for _ in range(30):
    torch.cuda.synchronize()
    t0 = time.perf_counter(); step(); tot.append(time.perf_counter() - t0)
torch.cuda.synchronize()
for k, v in rec.items():
    if v: print(f"{k:12s} n={len(v):3d} median {statistics.median(v)*1e3:.3f} ms  max {max(v)*1e3:.3f}")
print(f"step host  median {statistics.median(tot)*1e3:.3f} ms")
# a bare graph of one of our kernels' neighbours: torch foreach over the same tensors
g = torch.cuda.CUDAGraph()
xs = [p.detach().clone() for p in params]
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    torch._foreach_mul_(xs, 1.0)
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    torch._foreach_mul_(xs, 1.0)
ts = []
for _ in range(30):
    torch.cuda.synchronize(); t0 = time.perf_counter(); orig_replay(g); ts.append(time.perf_counter() - t0)
print(f"bare foreach graph replay median {statistics.median(ts)*1e3:.3f} ms")
# our graph replayed twice with no step in between
from thunder_fuser.cudagraphs import region_graphs as rg
