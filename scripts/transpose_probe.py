"""Elementwise programs and row reductions whose operands disagree on their fastest dim
(dev aid; GPU machine): x row-major beside y.t() or a permuted operand, so that the kernel
reads one operand across its rows. Prints ms and TB/s (bytes read plus written) beside
eager, torch.compile and a device-to-device copy measured in the same call; "gather" reads
such an operand element by element along the output's rows (session 13's kernels), "staged"
through shared-memory tiles (``geometry.STAGE_ROWS``; a row reduction copies such an
operand into its rows' order that way first, ``expr.transpose_first``). Each result is
checked against eager."""
import thunder_fuser  # noqa: F401
import thunder
import torch
import torch.nn.functional as F

from benchmarks.run import copy_bandwidth
from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
from thunder_fuser.kernels import geometry

RULES = {"gather": 2**31, "staged": geometry.STAGE_MIN_ROWS}  # geometry.STAGE_MIN_ROWS


def _pair(dtype, m=8192, n=4096):
    """x [m, n] row-major and y [n, m], read as y.t()."""
    return torch.randn(m, n, device="cuda", dtype=dtype), torch.randn(n, m, device="cuda", dtype=dtype)


def _heads(dtype):
    """x [16, 2048, 1024] and y [16, 1024, 2048], read as y.transpose(1, 2)."""
    return torch.randn(16, 2048, 1024, device="cuda", dtype=dtype), torch.randn(16, 1024, 2048, device="cuda", dtype=dtype)


CASES = {
    "x + y.t() fp32": (lambda x, y: x + y.t(), lambda: _pair(torch.float32)),
    "x + y.t() bf16": (lambda x, y: x + y.t(), lambda: _pair(torch.bfloat16)),
    "gelu(x * y.t()) bf16": (lambda x, y: F.gelu(x * y.t(), approximate="tanh"), lambda: _pair(torch.bfloat16)),
    "x + y.t() bf16 ragged": (lambda x, y: x + y.t(), lambda: _pair(torch.bfloat16, 4097, 4103)),
    "x * y.transpose(1, 2) bf16": (lambda x, y: x * y.transpose(1, 2), lambda: _heads(torch.bfloat16)),
    "(x + y.t()).sum(-1) fp32": (lambda x, y: (x + y.t()).sum(-1), lambda: _pair(torch.float32)),
    "softmax(x + y.t()) bf16": (lambda x, y: torch.softmax(x + y.t(), -1), lambda: _pair(torch.bfloat16)),
    "layer_norm(x * y.t()) bf16": (lambda x, y: F.layer_norm(x * y.t(), (4096,)), lambda: _pair(torch.bfloat16)),
}


def _moved(args, out) -> int:
    return sum(a.numel() * a.element_size() for a in args) + out.numel() * out.element_size()


def main():
    copy = copy_bandwidth()
    print(f"device-to-device copy {copy:.2f} TB/s; ms, then TB/s (read + written), then staged / copy")
    print(f"{'case':30s} {'eager':>7s} {'compile':>7s}" + "".join(f" {r:>7s}" for r in RULES)
          + f"  {'eager':>6s} {'compile':>7s}" + "".join(f" {r:>7s}" for r in RULES) + "  of copy")
    for name, (fn, make) in CASES.items():
        args = make()
        want = fn(*args)
        ms = [device_ms(fn, [args])[0], device_ms(torch.compile(fn), [args])[0]]
        for least in RULES.values():
            geometry.STAGE_MIN_ROWS = least
            f = thunder.jit(fn, executors=[fuser_ex])
            got = f(*args)
            tol = 3e-2 if want.dtype == torch.bfloat16 else 1e-3
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            ms.append(device_ms(f, [args])[0])
        tbs = [_moved(args, want) / (t * 1e-3) / 1e12 for t in ms]
        print(f"{name:30s}" + "".join(f" {t:7.4f}" for t in ms) + "  " + "".join(f" {b:6.2f} " for b in tbs)
              + f" {tbs[-1] / copy:6.0%}")


if __name__ == "__main__":
    main()
