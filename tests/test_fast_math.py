"""Approximate exp and reciprocal in kernels that store only fp16/bf16 (``cute_values.fast_math_for``).

A sigmoid is ``reciprocal(1 + exp(-x))``: exactly, nine instructions for the exp's range
reduction and a Newton step with a slow-path branch for the reciprocal, per element. Where
every store of a kernel rounds to 16 bits, ``ex2.approx`` and ``rcp.approx`` (errors of one or
two fp32 ulps, against a store's half ulp of 2**-9 or 2**-12) give the same values but for
rare ties. On the CPU: which instructions each kernel compiles to. On the GPU: the values
against the exact kernels' on inputs built to break the approximations (subnormals, huge,
infinite, NaN, where exp overflows or underflows).
"""

import math

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser
from helpers import assert_every_segment_ran_a_kernel, planned_parts, ptx_text
from thunder_fuser.backends.cute import segment_kernel


def swiglu_backward(gate, up, grad):
    """SwiGLU's backward as its region computes it: fp32 math, bf16 or fp16 stores."""
    g, u, d = gate.float(), up.float(), grad.float()
    s = torch.sigmoid(g)
    return (d * u * (s * (1 + g * (1 - s)))).to(gate.dtype), (d * g * s).to(gate.dtype)


def swiglu_backward_in_fp32(gate, up, grad):
    g, u, d = gate.float(), up.float(), grad.float()
    s = torch.sigmoid(g)
    return d * u * (s * (1 + g * (1 - s))), d * g * s


def _kernel_ptx(fn, dtype=torch.bfloat16) -> str:
    args = [torch.randn(64, 256, dtype=dtype) for _ in range(3)]
    (part,) = planned_parts(fn, args)
    assert part.prog.family == "pointwise"
    return ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_swiglu_backward_takes_one_instruction_for_each_exp_and_reciprocal(ptx_compile, dtype):
    ptx = _kernel_ptx(swiglu_backward, dtype)
    # one vector of 8 elements a thread: 8 of each, and no exact sequence's marks
    assert ptx.count("rcp.approx.f32") == 8 and ptx.count("ex2.approx") == 8
    assert "rcp.rn.f32" not in ptx and "fma.rm.f32" not in ptx


def test_the_same_backward_storing_fp32_keeps_the_exact_exp_and_reciprocal(ptx_compile):
    ptx = _kernel_ptx(swiglu_backward_in_fp32)  # a vector of 4 fp32 elements a thread
    assert "rcp.approx" not in ptx and ptx.count("rcp.rn.f32") == ptx.count("fma.rm.f32") == 4


def test_a_kernel_storing_fp32_beside_bf16_keeps_the_exact_exp_and_reciprocal(ptx_compile):
    """One fp32 store is enough: its values must be as exact as eager's fp32."""
    def mixed(gate, up, grad):
        a, b = swiglu_backward(gate, up, grad)
        return a, torch.sigmoid(gate.float()) * up.float()

    ptx = _kernel_ptx(mixed)
    assert "rcp.approx" not in ptx and ptx.count("rcp.rn.f32") > 0 and ptx.count("fma.rm.f32") > 0


def test_fast_math_off_keeps_the_exact_sequences_in_16_bits(ptx_compile, monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_FAST_MATH", "0")
    ptx = _kernel_ptx(swiglu_backward)
    assert "rcp.approx" not in ptx and ptx.count("rcp.rn.f32") == 8 and ptx.count("fma.rm.f32") == 8


# where the approximations could part from the exact results: exp's overflow (x > 88.72)
# and underflow into subnormals (x < -87.3), a reciprocal of a subnormal result, subnormal
# and huge inputs, the infinities, NaN, signed zeros
EDGES = [0.0, -0.0, 1e-40, -1e-40, 1e-38, -1e-38, 3e38, -3e38, math.inf, -math.inf, math.nan,
         87.0, -87.0, 88.5, -88.5, 88.8, -88.8, 89.0, -89.0, 103.0, -103.0, 20.0, -20.0, 1e4, -1e4]

# name -> (function, tensor arguments)
ACTIVATIONS = {
    "sigmoid": (torch.sigmoid, 1), "silu": (F.silu, 1), "exp": (torch.exp, 1), "reciprocal": (torch.reciprocal, 1),
    "softplus": (F.softplus, 1), "tanh": (torch.tanh, 1), "silu times up": (lambda x, u: F.silu(x) * u, 2),
}
_SMALLEST_NORMAL = 2.0 ** -126  # ex2.approx.ftz flushes a result below it to zero


def _values(n: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 6
    x[: len(EDGES)] = torch.tensor(EDGES)
    return x[torch.randperm(n, generator=g)].to(dtype).cuda()


def _ulps_apart(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """How many representable values of their 16-bit dtype lie between two results: 0 where
    both are NaN or both below the smallest normal fp32 (a flushed subnormal), infinity
    where one is NaN and the other not."""
    a, b = (t.view(torch.int16).long() for t in (got, want))
    a, b = (torch.where(t < 0, -32768 - t, t) for t in (a, b))  # sign-magnitude to an ordered line
    apart = (a - b).abs().float()
    gn, wn = got.float().isnan(), want.float().isnan()
    tiny = (got.float().abs() < _SMALLEST_NORMAL) & (want.float().abs() < _SMALLEST_NORMAL)
    apart = torch.where((gn & wn) | tiny, 0.0, apart)
    return torch.where(gn != wn, math.inf, apart)


def _stepped(f, args, grad, fast: bool, monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_FAST_MATH", "1" if fast else "0")
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    leaves = [a.clone().requires_grad_() for a in args]
    out = jf(*leaves)
    out.backward(grad)
    assert_every_segment_ran_a_kernel(jf)
    return [out.detach()] + [leaf.grad for leaf in leaves]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_16_bit_activations_with_fast_math_keep_the_exact_kernels_values_on_inputs_built_to_break_them(
        name, dtype, monkeypatch):
    """Every value and every gradient of the fast kernels within one ulp of the exact
    kernels' (``THUNDER_FUSER_FAST_MATH=0``), NaN where they have NaN, both flushed or both
    not below fp32's smallest normal, and at most one element in a hundred off at all."""
    monkeypatch.setattr(segment_kernel, "FILL_NAN", True)
    f, arity = ACTIVATIONS[name]
    n = 1 << 14
    args = [_values(n, dtype, seed) for seed in range(arity)]
    grad = _values(n, dtype, 7)
    fast, exact = (_stepped(f, args, grad, on, monkeypatch) for on in (True, False))
    for what, got, want in zip(["value"] + [f"gradient {i}" for i in range(arity)], fast, exact):
        apart = _ulps_apart(got, want)
        worst = int(apart.argmax())
        assert apart.max() <= 1, (what, got[worst], want[worst], [a[worst] for a in args], grad[worst])
        assert (apart > 0).float().mean() <= 1e-2, what
