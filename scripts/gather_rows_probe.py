"""Row reductions that read an operand strided along the row, and reductions of a few long
rows (dev aid; GPU machine). "s11": session 11's rules (a strided operand sends a row
reduction to the reference backend, torch op by op; every row a block of its own);
"rows": ``geometry.GATHER_ROWS`` gathers the strided operand in the row kernel, every row
still a block of its own (session 12 sent fewer than four long rows to the reference
backend instead); "now": a few long rows split across blocks (``geometry.SPLIT_MIN``).
Prints ms of each beside eager and torch.compile; each result is checked against eager.
``python scripts/gather_rows_probe.py long`` runs the long-row cases only."""
import sys

import thunder_fuser  # noqa: F401
import thunder
import torch
import torch.nn.functional as F

from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
from thunder_fuser.kernels import geometry


def _mixed(dtype):
    """x row-major, y.t() column-major: the row is x's innermost dim and y's outermost."""
    return torch.randn(8192, 4096, device="cuda", dtype=dtype), torch.randn(4096, 8192, device="cuda", dtype=dtype)


CASES = {
    "(x + y.t()).sum(-1) fp32": (lambda x, y: (x + y.t()).sum(-1), lambda: _mixed(torch.float32)),
    "softmax(x + y.t()) bf16": (lambda x, y: torch.softmax(x + y.t(), -1), lambda: _mixed(torch.bfloat16)),
    "layer_norm(x * y.t()) bf16": (lambda x, y: F.layer_norm(x * y.t(), (4096,)), lambda: _mixed(torch.bfloat16)),
    "(a + a).sum(0), a = v[::2] fp32": (lambda a: (a + a).sum(0),
                                        lambda: (torch.randn(2**27, device="cuda")[::2],)),
    "x.sum(), 64M fp32": (lambda x: x.sum(), lambda: (torch.randn(2**26, device="cuda"),)),
    "(x * y).sum(-1), [4, 4M] bf16": (lambda x, y: (x * y).sum(-1), lambda: _bf16(2, 4, 2**22)),
    "(x * y).sum(-1), [16, 1M] bf16": (lambda x, y: (x * y).sum(-1), lambda: _bf16(2, 16, 2**20)),
    "(x * y).sum(-1), [48, 1M] bf16": (lambda x, y: (x * y).sum(-1), lambda: _bf16(2, 48, 2**20)),
    "x.var(), 64M fp32": (lambda x: x.var(), lambda: (torch.randn(2**26, device="cuda"),)),
    "mse_loss, [8192, 4096] bf16": (F.mse_loss, lambda: _bf16(2, 8192, 4096)),
    "layer_norm, [4, 1M] bf16": (lambda x: F.layer_norm(x, (2**20,)), lambda: _bf16(1, 4, 2**20)),
    "softmax, [2, 1M] fp32": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(2, 2**20, device="cuda"),)),
    "softmax(x, 0), [32768, 64] fp32": (lambda x: torch.softmax(x, 0), lambda: (torch.randn(2**15, 64, device="cuda"),)),
    "x.sum(), 1M fp32": (lambda x: x.sum(), lambda: (torch.randn(2**20, device="cuda"),)),
}
LONG = [name for name in CASES if "y.t()" not in name and "v[::2]" not in name]
RULES = {
    "s11": dict(GATHER_ROWS=False, SPLIT_MIN=2**31),
    "rows": dict(GATHER_ROWS=True, SPLIT_MIN=2**31),
    "now": dict(GATHER_ROWS=True, SPLIT_MIN=geometry.SPLIT_MIN),
}


def _bf16(count, *shape):
    return tuple(torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(count))


def main():
    names = LONG if sys.argv[1:] == ["long"] else list(CASES)
    print(f"{'case':34s} {'eager':>8s} {'compile':>8s}" + "".join(f" {'fuser ' + r:>10s}" for r in RULES) + "  (ms)")
    for name in names:
        fn, make = CASES[name]
        args = make()
        want = fn(*args)
        row = [device_ms(fn, [args])[0], device_ms(torch.compile(fn), [args])[0]]
        for rules in RULES.values():
            for k, v in rules.items():
                setattr(geometry, k, v)
            f = thunder.jit(fn, executors=[fuser_ex])
            got = f(*args)
            tol = 3e-2 if want.dtype == torch.bfloat16 else 1e-3
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            row.append(device_ms(f, [args])[0])
        print(f"{name:34s} {row[0]:8.4f} {row[1]:8.4f}" + "".join(f" {x:10.4f}" for x in row[2:]))


if __name__ == "__main__":
    main()
