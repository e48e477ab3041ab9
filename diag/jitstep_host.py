import cProfile, pstats, time, sys
import torch
import thunder_fuser, thunder
from benchmarks import model_zoo
cuda = torch.cuda.is_available()
dev = "cuda" if cuda else "cpu"
sync = torch.cuda.synchronize if cuda else (lambda: None)
built = model_zoo.build("hf-GPT2", 12, not cuda, dev, torch.bfloat16 if cuda else torch.float32)
params = [p for p in built.module.parameters()]
for p in params: p.grad = torch.randn_like(p)
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
step = thunder.jit(opt.step, executors=thunder_fuser.executors())
for _ in range(3): step()
print(len(params), "tensors", sum(p.numel() for p in params))
N = 50
t0 = time.perf_counter()
for _ in range(N): step()
sync()
print(f"{(time.perf_counter()-t0)/N*1e3:.3f} ms/step")
o2 = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in params], lr=1e-3, foreach=True)
for p, q in zip(o2.param_groups[0]["params"], params): p.grad = q.grad
o2.step()
t0 = time.perf_counter()
for _ in range(N): o2.step()
sync()
print(f"eager foreach {(time.perf_counter()-t0)/N*1e3:.3f} ms/step")
pr = cProfile.Profile(); pr.enable()
for _ in range(N): step()
sync()
pr.disable()
st = pstats.Stats(pr)
groups = {}
for (path, _, name), (_, _, tt, _, _) in st.stats.items():
    k = "thunder_fuser" if "thunder_fuser" in path else "<gen>" if path.startswith("<") else "thunder" if "/thunder/" in path else "torch" if "/torch/" in path else "C" if path == "~" else "other"
    groups[k] = groups.get(k, 0) + tt
print({k: round(v / N * 1e3, 3) for k, v in groups.items()}, "ms/step under cProfile")
st.sort_stats("tottime").print_stats(30)
