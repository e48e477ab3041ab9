"""Where the allocator places a short workload's buffers, and what that does to its
bandwidth (dev aid; GPU machine): RoPE Mistral-7B's inputs behind 0-100 MiB of padding,
thunder+fuser and torch.compile each timed by one replay after a sync and by queued replays
(``device_ms(queued=...)``), beside a queued copy of 41 MiB buffers allocated after them."""
import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.suite import cases, nbytes
from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex


def main():
    c = next(c for c in cases() if c.kind == "large" and c.name == "RoPE Mistral-7B bf16")
    contenders = (thunder.jit(c.fn, executors=[fuser_ex]), torch.compile(c.fn))
    for pad_mib in (0, 1, 2, 3, 5, 8, 13, 21, 34, 100):
        torch.cuda.empty_cache()
        pad = torch.empty(pad_mib * 2**20 + 1, dtype=torch.uint8, device="cuda")
        args = c.make()
        n = nbytes(c, args, c.fn(*args))
        row = []
        for f in contenders:
            f(*args)
            row += [n / device_ms(f, [args], queued=q)[0] / 1e9 for q in (False, True)]
        a = torch.randn(41 * 2**20 // 4, device="cuda")
        b = torch.empty_like(a)
        copy = 2 * a.numel() * 4 / device_ms(lambda: b.copy_(a), [()])[0] / 1e9
        where = [hex(t.data_ptr() % 2**30) for t in args[:2]]
        print(f"pad {pad_mib:4d} MiB  fuser one/queued {row[0]:.2f} {row[1]:.2f}  torch.compile {row[2]:.2f} "
              f"{row[3]:.2f}  copy of 41 MiB (queued) {copy:.2f}  q, k at {where} mod 1 GiB")
        del pad, args, a, b


if __name__ == "__main__":
    main()
