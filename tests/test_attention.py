"""attention_ex: SDPA beside our regions, with and without a mask, forward and backward
against eager; what it leaves to the executors after it. On the CPU it runs torch's CPU
flash kernel laid out as cuDNN's outputs are; the ``cuda`` test runs cuDNN's attention."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser


def _claimed(jfn) -> bool:
    return "fuser_attention_forward" in str(thunder.last_traces(jfn)[-1])


def _qkv(device, dtype, sq=8, sk=8, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, s, 16, generator=g).to(device, dtype) for s in (sq, sk, sk))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


MASKS = {
    "bool [1, 1, sq, sk]": lambda sq, sk: torch.ones(sq, sk, dtype=torch.bool).tril()[None, None],
    "bool [sq, sk]": lambda sq, sk: torch.ones(sq, sk, dtype=torch.bool).tril(),
    "bool one row per head [2, 4, 1, sk]": lambda sq, sk: torch.rand(2, 4, 1, sk, generator=torch.Generator().manual_seed(1)) > 0.3,
    "additive [1, 1, sq, sk]": lambda sq, sk: torch.randn(1, 1, sq, sk, generator=torch.Generator().manual_seed(2)),
}


def _masked_matches_eager(mask_name: str, device: str, dtype, tol: float, sq: int = 8) -> None:
    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)

    mask = MASKS[mask_name](sq, 8).to(device)
    if mask.dtype != torch.bool:
        mask = mask.to(dtype)
    if mask_name.startswith("bool one row"):
        mask[..., 0] = True  # no row with every key masked (its softmax is undefined)
    ours, want_in = _qkv(device, dtype, sq=sq), _qkv(device, dtype, sq=sq)
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    got, want = jf(*ours, mask), f(*want_in, mask)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    for a, b in zip(ours, want_in):
        torch.testing.assert_close(a.grad, b.grad, atol=tol, rtol=tol)
    assert _claimed(jf), "a masked SDPA went past attention_ex"


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_masked_attention_runs_on_attention_ex_and_matches_eager(mask_name):
    _masked_matches_eager(mask_name, "cpu", torch.float32, 1e-5)


def test_a_decode_step_mask_one_query_over_the_cache():
    """litgpt's decode: one query against every cached key, the mask's row for the position."""
    _masked_matches_eager("bool [1, 1, sq, sk]", "cpu", torch.float32, 1e-5, sq=1)


def test_a_bias_that_needs_a_gradient_and_a_mask_with_is_causal_are_left_to_the_next_executor():
    q, k, v = _qkv("cpu", torch.float32)
    bias = torch.randn(1, 1, 8, 8, requires_grad=True)

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    jf = thunder.jit(f, executors=thunder_fuser.executors())
    torch.testing.assert_close(jf(q, k, v, bias), f(q, k, v, bias))
    assert not _claimed(jf)


@pytest.mark.cuda
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_masked_attention_on_cudnn(mask_name):
    _masked_matches_eager(mask_name, "cuda", torch.bfloat16, 2e-2)


@pytest.mark.parametrize("way", ["thunder.jit", "ThunderFX"])
def test_grouped_query_attention_by_enable_gqa_matches_eager(way):
    """issue 62: ``enable_gqa=True`` (current PyTorch's grouped-query attention) failed with
    every executor in thunder 0.2.6 ('unexpected keyword argument'): translated into key and
    value repeated per query head (``patches/missing_torch_ops.py``), forward and gradients as eager's."""
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    if way == "thunder.jit":
        fn = thunder.jit(f, executors=thunder_fuser.executors())
    else:
        from thunder.dynamo import ThunderCompiler

        torch._dynamo.reset()
        backend = ThunderCompiler(executors=thunder_fuser.executors())
        fn = torch.compile(f, backend=backend)
    q, k, v = (torch.randn(2, h, 16, 32, requires_grad=True) for h in (8, 2, 2))
    got, want = fn(q, k, v), f(q, k, v)
    torch.testing.assert_close(got, want)
    if way == "ThunderFX":  # thunder took the attention (it left it to Inductor before)
        assert [f for info in backend.subgraph_infos for f in info.thunder_compiled_fns]
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g))
