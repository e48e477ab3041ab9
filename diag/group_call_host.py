import time, statistics, torch
import thunder_fuser, thunder
from benchmarks import model_zoo
built = model_zoo.build("hf-GPT2", 12, True, "cpu", torch.float32)
params = list(built.module.parameters())
for p in params: p.grad = torch.randn_like(p)
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
step = thunder.jit(opt.step, executors=thunder_fuser.executors())
for _ in range(3): step()
g = opt.param_groups[0]
ts = []
for _ in range(200):
    t0 = time.perf_counter(); c = step._group_call(g); ts.append(time.perf_counter() - t0)
print(f"_group_call median {statistics.median(ts)*1e6:.0f} us")
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(200): step._group_call(g)
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(12)
