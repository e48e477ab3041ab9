"""Is the causal softmax's cost its per-element IEEE division? (dev aid; run on the GPU
machine). The causal mask makes half of the numerators exp(-inf) = 0, which may send
``div.rn.f32`` to its slow path. Times thunder+fuser's causal and plain softmax of
[8, 16, 1024, 1024] bf16 scores as written (``e / sum``) and with one reciprocal per row
(``e * (1 / sum)``), device time from CUDA graphs, TB/s over bytes read and written once."""
import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex


def _mask(s):
    n = s.shape[-1]
    i = torch.arange(n, device=s.device)
    return torch.where(i[:, None] >= i[None, :], s, float("-inf"))


def _softmax(x, rcp):
    x = x.float()
    e = torch.exp(x - x.amax(-1, keepdim=True))
    t = e.sum(-1, keepdim=True)
    return (e * (1.0 / t) if rcp else e / t)


def causal_div(s):
    return _softmax(_mask(s), False).to(s.dtype)


def causal_rcp(s):
    return _softmax(_mask(s), True).to(s.dtype)


def plain_div(s):
    return _softmax(s, False).to(s.dtype)


def plain_rcp(s):
    return _softmax(s, True).to(s.dtype)


def main():
    s = torch.randn(8, 16, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    nbytes = 2 * s.numel() * s.element_size()
    for fn in (causal_div, causal_rcp, plain_div, plain_rcp):
        j = thunder.jit(fn, executors=[fuser_ex])
        torch.testing.assert_close(j(s), fn(s), atol=2e-2, rtol=2e-2)
        ms, _ = device_ms(j, [(s,)])
        print(f"{fn.__name__:12s} {ms:8.4f} ms {nbytes / ms / 1e9:6.2f} TB/s")


if __name__ == "__main__":
    main()
