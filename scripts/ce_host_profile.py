"""Where the host time of a thunder + fuser loss step goes (GPU machine): wall time per step
of ``F.cross_entropy(x.float(), t)`` forward + backward at a small, host-bound shape, then
cProfile's top functions by total and cumulative time.

    python scripts/ce_host_profile.py [tokens vocab]
"""

import cProfile
import pstats
import sys
import time

import torch
import torch.nn.functional as F

import thunder_fuser  # noqa: F401
import thunder
from thunder_fuser import fuser_ex

n, v = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (4096, 32000)
x = torch.randn(n, v, device="cuda", dtype=torch.bfloat16, requires_grad=True)
t = torch.randint(0, v, (n,), device="cuda")


def host_ms(f, a, b, k=200):
    """Wall ms per forward + backward step of ``f(a, b)``, after 10 warm-up steps."""
    for _ in range(10):
        a.grad = None
        f(a, b).backward()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(k):
        a.grad = None
        f(a, b).backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / k * 1e3


def fuser_loss():
    return thunder.jit(lambda x, t: F.cross_entropy(x.float(), t), executors=[fuser_ex])


print(f"wall ms per step: {host_ms(fuser_loss(), x, t, 100):.3f}")
small = torch.randn(64, 320, device="cuda", dtype=torch.bfloat16, requires_grad=True)
ts = torch.randint(0, 320, (64,), device="cuda")
fs = fuser_loss()
print(f"host ms per step at [64, 320]: {host_ms(fs, small, ts):.3f}")


# the floor of any thunder-jitted training step: one tiny differentiable op
floors = {
    "thunder, x.float().sum(), default executors": thunder.jit(lambda x, t: x.float().sum()),
    "thunder, x.float().sum(), fuser_ex": thunder.jit(lambda x, t: x.float().sum(), executors=[fuser_ex]),
    "eager F.cross_entropy": lambda x, t: F.cross_entropy(x.float(), t),
}
try:
    from quack.cross_entropy import cross_entropy as quack_ce

    floors["quack cross_entropy"] = lambda x, t: quack_ce(x, t, reduction="mean")
except Exception as e:  # noqa: BLE001
    print("quack:", type(e).__name__, e)
for name, f in floors.items():
    print(f"host ms per step at [64, 320], {name}: {host_ms(f, small, ts):.3f}")
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    small.grad = None
    fs(small, ts).backward()
torch.cuda.synchronize()
pr.disable()
st = pstats.Stats(pr)
st.sort_stats("tottime").print_stats(25)
st.sort_stats("cumulative").print_stats(40)
