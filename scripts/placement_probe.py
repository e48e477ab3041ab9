import statistics, torch, thunder_fuser, thunder
from benchmarks.suite import cases, nbytes
from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
c = next(c for c in cases() if c.kind == "large" and c.name == "RoPE Mistral-7B bf16")
f = thunder.jit(c.fn, executors=[fuser_ex])
tc = torch.compile(c.fn)
for pad_mib in (0, 1, 2, 3, 5, 8, 13, 21, 34, 100):
    torch.cuda.empty_cache()
    pad = torch.empty(pad_mib * 2**20 + 1, dtype=torch.uint8, device="cuda")
    args = c.make()
    n = nbytes(c, args, c.fn(*args))
    row = []
    for g in (f, tc):
        g(*args)
        row += [n / device_ms(g, [args], queued=q)[0] / 1e9 for q in (False, True)]
    a = torch.randn(41 * 2**20 // 4, device="cuda"); b = torch.empty_like(a)
    cp = 2 * a.numel() * 4 / device_ms(lambda: b.copy_(a), [()], queued=True)[0] / 1e9
    addrs = [hex(t.data_ptr() % 2**30) for t in args[:2]]
    print(f"pad {pad_mib:4d} MiB fuser one/queued {row[0]:.2f} {row[1]:.2f} compile {row[2]:.2f} {row[3]:.2f} copy41q {cp:.2f} {addrs}")
    del pad, args, a, b
