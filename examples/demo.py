"""Demo: a small transformer-style block (RMSNorm, gelu MLP, residual, one in-place
update) jitted with fuser_ex; prints the trace and checks the result against eager."""

import thunder_fuser  # noqa: F401  (must come before thunder: restores torch compat stubs)
from thunder_fuser import explain, fuser_ex

import thunder
import torch


def block(x, norm_w, w1, b1, w2, b2, step_count):
    xf = x.float()
    h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    h = (h * norm_w).to(x.dtype)
    h = torch.nn.functional.gelu(torch.nn.functional.linear(h, w1, b1), approximate="tanh")
    out = x + torch.nn.functional.linear(h, w2, b2)
    step_count.add_(1)  # an in-place update, fused with the residual region
    return out


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    b, s, d = 2, 16, 64
    make = lambda *shape: torch.randn(*shape, device=device, dtype=dtype)  # noqa: E731
    args = [make(b, s, d), make(d), make(4 * d, d), make(4 * d), make(d, 4 * d), make(d)]
    counter = torch.zeros((), device=device)
    jblock = thunder.jit(block, executors=[fuser_ex])
    got = jblock(*args, counter)
    ref_counter = torch.zeros((), device=device)
    expected = block(*args, ref_counter)
    print(thunder.last_traces(jblock)[-1])
    print(explain(jblock))
    # bf16: eager rounds every op to bf16, the fused region keeps fp32 intermediates
    tol = dict(atol=5e-2, rtol=5e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, expected, **tol)
    torch.testing.assert_close(counter, ref_counter)
    print(f"matches eager ({device}, {dtype})")


if __name__ == "__main__":
    main()
