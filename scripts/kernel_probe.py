"""Quick GPU probe: device bandwidth (graph replays) of fused workloads vs copy (dev aid)."""
import time, torch, thunder, warnings
from thunder_fuser import fuser_ex
from benchmarks.workloads import gelu_bias, rmsnorm, softmax, rotate_half_residual, adam_step
from benchmarks.timing import device_ms, host_us
from thunder_fuser.kernels import cache

bf = dict(device="cuda", dtype=torch.bfloat16)
x = torch.randn(8192, 4096, **bf)
y = torch.empty_like(x)
big = torch.randn(256 * 1024 * 1024 // 4, device="cuda")
bigo = torch.empty_like(big)
ms, g = device_ms(lambda: bigo.copy_(big), [()]); copy = 2 * big.numel() * 4 / ms / 1e9
print(f"copy {copy:.2f} TB/s graph={g}")
P = 64 * 1024 * 1024
adam_args = [[torch.randn(P, device="cuda")] for _ in range(4)]
cases = [("gelu_bias", gelu_bias, (x, torch.randn(4096, **bf)), 2*x.numel()*2),
         ("rmsnorm", rmsnorm, (torch.randn(32768, 4096, **bf), torch.randn(4096, **bf)), 2*32768*4096*2),
         ("softmax", softmax, (x,), 2*x.numel()*2),
         ("rot", rotate_half_residual, (torch.randn(8, 32, 4096, 128, **bf),), 2*8*32*4096*128*2),
         ("adam", adam_step, tuple(adam_args), P * 4 * 7)]
for name, fn, args, nbytes in cases:
    t0 = time.time()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        j = thunder.jit(fn, executors=[fuser_ex]); j(*args); torch.cuda.synchronize()
    first = time.time() - t0
    row = [name]
    for label, f in (("fuser", j), ("eager", fn), ("compile", torch.compile(fn))):
        try:
            ms, g = device_ms(f, [args])
            row.append(f"{label} {nbytes/ms/1e9:.2f} TB/s ({nbytes/ms/1e9/copy:.0%}){'' if g else ' nograph'}")
        except Exception as e:
            row.append(f"{label} FAIL {type(e).__name__} {str(e)[:100]}")
    print(", ".join(row), f"first {first:.1f}s", [str(x.message)[:300] for x in w if 'reference' in str(x.message)])
# host overhead of one small region: the runner alone and the thunder call
from thunder_fuser.runtime.region_runner import RegionRunner
seen = []
orig = RegionRunner.__call__
def rec(self, *a):
    seen.append((self, a)); return orig(self, *a)
RegionRunner.__call__ = rec
xs, bs = torch.randn(8, 64, **bf), torch.randn(64, **bf)
j = thunder.jit(gelu_bias, executors=[fuser_ex]); j(xs, bs)
RegionRunner.__call__ = orig
runner, rargs = seen[-1]
print(f"host us: thunder+fuser {host_us(j, (xs, bs)):.1f}, region runner {host_us(runner, rargs):.1f}, eager {host_us(gelu_bias, (xs, bs)):.1f}")
print(cache.stats)
