"""Norm backwards whose weight and bias gradients (sums over the rows) ride in the row kernel
of the input gradient (dev aid; GPU machine): ms for eager, torch.compile and thunder+fuser
with the sums apart (session 16: a second kernel reads the operands again) and in the row
kernel at 256, 384 and 512 threads per SM (``geometry.ACROSS_THREADS_PER_SM``), the default
last. The
backwards are written out (``thunder.jit`` and ``torch.compile`` see the same program, no
autograd); ``ops_profile.py "rmsnorm fwd+bwd"`` times the autograd one."""
import torch

from scripts.long_rows_probe import main
from thunder_fuser.kernels import geometry


def rms_backward(x, w, g, rstd):
    """RMSNorm's input and weight gradients, in fp32 from bf16 operands, as thunder's trace has them."""
    xf, gf, wf = x.float(), g.float(), w.float()
    xhat = xf * rstd
    gw = gf * wf
    dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), (gf * xhat).sum(0).to(w.dtype)


def ln_backward(x, w, g, mean, rstd):
    """A layer norm's input, weight and bias gradients, in fp32 from bf16 operands."""
    xf, gf, wf = x.float(), g.float(), w.float()
    xhat = (xf - mean) * rstd
    gw = gf * wf
    dx = rstd * (gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True))
    rows = tuple(range(x.ndim - 1))
    return dx.to(x.dtype), (gf * xhat).sum(rows).to(w.dtype), gf.sum(rows).to(w.dtype)


def _rms_args(m, n):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    return torch.randn(m, n, **bf), torch.randn(n, **bf), torch.randn(m, n, **bf), torch.rand(m, 1, device="cuda") + 0.5


def _ln_args(*shape):
    bf = dict(device="cuda", dtype=torch.bfloat16)
    stat = (*shape[:-1], 1)
    return (torch.randn(*shape, **bf), torch.randn(shape[-1], **bf), torch.randn(*shape, **bf),
            torch.randn(*stat, device="cuda") * 0.1, torch.rand(*stat, device="cuda") + 0.5)


CASES = {
    "rmsnorm backward bf16 [16384, 4096]": (rms_backward, lambda: _rms_args(16384, 4096)),
    "rmsnorm backward bf16 [4096, 4096]": (rms_backward, lambda: _rms_args(4096, 4096)),
    "layer norm backward bf16 [8, 1024, 1024]": (ln_backward, lambda: _ln_args(8, 1024, 1024)),
    "layer norm backward bf16 [32768, 4096]": (ln_backward, lambda: _ln_args(32768, 4096)),
    "layer norm backward bf16 [16384, 8192]": (ln_backward, lambda: _ln_args(16384, 8192)),
}

VARIANTS = {
    "apart": {(geometry, "COLUMN_SUM_REGISTERS"): 0},
    "256/SM": {(geometry, "ACROSS_THREADS_PER_SM"): {64: 256}},
    "384/SM": {(geometry, "ACROSS_THREADS_PER_SM"): {64: 384}},
    "512/SM": {(geometry, "ACROSS_THREADS_PER_SM"): {64: 512}},
    "default": {},
}

if __name__ == "__main__":
    main(CASES, VARIANTS)
