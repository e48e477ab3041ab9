"""Grouped-query attention reads K and V at their own heads (``passes/grouped_query_attention.py``):
values and gradients as near float64's as eager's, the caller's tensors untouched, the
expansion gone from the trace where nothing else reads it, and kept where something does or
where the expansion maps heads otherwise (a tile, ``k.repeat``)."""

from __future__ import annotations

import copy

import pytest
import thunder
import torch
import torch.nn.functional as F
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import thunder_fuser
from helpers import assert_as_near_float64


def _interleaved(t, g):  # litgpt
    return t.repeat_interleave(g, dim=1)


def _repeat_kv(t, g):  # transformers, then its sdpa_attention_forward's contiguous()
    b, h, s, d = t.shape
    return t[:, :, None, :, :].expand(b, h, g, s, d).reshape(b, h * g, s, d).contiguous()


def _tiled(t, g):  # head h reads K/V head h % hk: not grouped-query's map
    return t.repeat(1, g, 1, 1)


EXPANSIONS = {"repeat_interleave": _interleaved, "repeat_kv": _repeat_kv, "tile": _tiled}


class _Attention(torch.nn.Module):
    """Projections of x to q (``hq`` heads) and k, v (``hk``), expanded, attention, an output
    projection: what a layer does around the rule. ``extra``: the expanded K read by the loss
    too (its gradient then meets attention's before the group sum)."""

    def __init__(self, hq, hk, d, expand, mask=False, extra=False):
        super().__init__()
        self.hq, self.hk, self.d, self.expand, self.mask, self.extra = hq, hk, d, expand, mask, extra
        self.q = torch.nn.Linear(32, hq * d, bias=False)
        self.kv = torch.nn.Linear(32, 2 * hk * d, bias=False)
        self.o = torch.nn.Linear(hq * d, 32, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.hq, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.hk, self.d).unbind(2)
        k, v = (EXPANSIONS[self.expand](t.transpose(1, 2), self.hq // self.hk) for t in (k, v))
        if self.mask:
            keep = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.o(y.transpose(1, 2).reshape(b, s, -1))
        return out.float().square().mean() + ((k.float() ** 2).mean() if self.extra else 0.0)


def _attention_heads(trace) -> list[tuple[int, int]]:
    """(q's heads, k's heads) of each attention call ``trace`` makes, forward or backward."""
    calls = []
    for b in trace.bound_symbols:
        if b.sym.name == "fuser_attention_forward":
            calls.append((b.args[0].shape[1], b.args[1].shape[1]))
        elif b.sym.name == "fuser_attention_backward":
            calls.append((b.args[1].shape[1], b.args[2].shape[1]))
    return calls


def _step(module, x):
    """``module`` through thunder + fuser, one forward and backward: the loss and gradients
    each as near a float64 copy's as eager's; the jitted module."""
    eager, exact = copy.deepcopy(module), copy.deepcopy(module).double()
    x_before = x.clone()
    jm = thunder.jit(module, executors=thunder_fuser.executors())
    xs = [x.clone().requires_grad_() for _ in range(2)] + [x.double().requires_grad_()]
    losses = [f(t) for f, t in zip((jm, eager, exact), xs)]
    for loss in losses:
        loss.backward()
    assert torch.equal(x, x_before), "the caller's input changed"
    assert_as_near_float64(losses[0].detach(), losses[1].detach(), losses[2].detach(), "the loss")
    assert_as_near_float64(xs[0].grad, xs[1].grad, xs[2].grad, "x's gradient")
    for (name, p), e, t in zip(module.named_parameters(), eager.parameters(), exact.parameters()):
        assert_as_near_float64(p.grad, e.grad, t.grad, f"{name}'s gradient")
    return jm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("expand", ["repeat_interleave", "repeat_kv"])
@pytest.mark.parametrize("hq,hk", [(4, 2), (6, 1)], ids=["grouped", "multi-query"])
def test_grouped_keys_and_values_reach_attention_at_their_own_heads(hq, hk, expand, dtype):
    """Forward and backward attention read K and V at ``hk`` heads, the backward hands back
    their gradients summed over each group, and the trace says so beside each call."""
    torch.manual_seed(0)
    module = _Attention(hq, hk, 16, expand).to(dtype)
    jm = _step(module, torch.randn(2, 24, 32, dtype=dtype))
    fwd, bwd = thunder.last_traces(jm)[-1], thunder.last_backward_traces(jm)[-1]
    assert _attention_heads(fwd) + _attention_heads(bwd) == [(hq, hk), (hq, hk)]
    note = f"grouped-query: K and V read at their {hk} heads, each shared by {hq // hk} query heads"
    assert note in str(fwd) and note in str(bwd)
    # no expansion nor group sum anywhere, in a region or out: nothing [b, hk, g, s, d]
    grouped = (2, hk, hq // hk, 24, 16)
    assert not [b for t in (fwd, bwd) for b in _every_bsym(t.bound_symbols)
                for o in b.flat_outs if getattr(o, "shape", None) == grouped]


def _every_bsym(bsyms):
    for b in bsyms:
        yield b
        yield from _every_bsym(b.subsymbols)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_boolean_mask_with_grouped_keys_keeps_eagers_values(dtype):
    torch.manual_seed(1)
    jm = _step(_Attention(4, 2, 16, "repeat_interleave", mask=True).to(dtype), torch.randn(2, 24, 32, dtype=dtype))
    assert _attention_heads(thunder.last_traces(jm)[-1]) == [(4, 2)]


def test_an_expansion_read_elsewhere_too_is_kept_for_that_reader_and_its_gradient_joins_attentions():
    """The loss reads the expanded K as well: the forward's attention still reads K at its
    heads (the expansion is made for the other reader), and the backward, whose K gradient
    gathers the other reader's before the group sum, keeps reading the expanded K."""
    torch.manual_seed(2)
    jm = _step(_Attention(4, 2, 16, "repeat_interleave", extra=True), torch.randn(2, 24, 32))
    assert _attention_heads(thunder.last_traces(jm)[-1]) == [(4, 2)]
    assert _attention_heads(thunder.last_backward_traces(jm)[-1]) == [(4, 4)]


def test_a_tiled_expansion_maps_heads_otherwise_and_is_left_expanded():
    """``k.repeat(1, g, 1, 1)``: query head h reads K head ``h % hk``, not ``h // g``; read at
    its own heads attention would pair the wrong heads."""
    torch.manual_seed(3)
    jm = _step(_Attention(4, 2, 16, "tile"), torch.randn(2, 24, 32))
    assert _attention_heads(thunder.last_traces(jm)[-1]) == [(4, 4)]


def test_the_setting_at_zero_leaves_the_expansion(monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_GQA", "0")
    torch.manual_seed(4)
    jm = _step(_Attention(4, 2, 16, "repeat_interleave"), torch.randn(2, 24, 32))
    assert _attention_heads(thunder.last_traces(jm)[-1]) == [(4, 4)]
    assert "grouped-query" not in str(thunder.last_traces(jm)[-1])


@settings(max_examples=8, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))  # a compile an example: no shrinking
@given(hk=st.sampled_from([1, 2, 3]), g=st.sampled_from([2, 3, 4]), s=st.integers(1, 40),
       expand=st.sampled_from(sorted(EXPANSIONS)), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_any_grouping_and_length_keeps_eagers_values(hk, g, s, expand, dtype):
    """Property: every head count, group size, sequence length (one included) and expansion,
    rewritten or not, gives eager's loss and gradients (within their float64 distance)."""
    torch.manual_seed(s)
    jm = _step(_Attention(hk * g, hk, 8, expand).to(dtype), torch.randn(2, s, 32, dtype=dtype))
    heads = _attention_heads(thunder.last_traces(jm)[-1])
    if expand != "tile":
        assert heads == [(hk * g, hk)]
    elif hk > 1:  # a tile of one head would be the same map; of more, never read grouped
        assert heads == [(hk * g, hk * g)]


@pytest.mark.cuda
@pytest.mark.parametrize("hq,hk,d", [(32, 8, 64), (71, 1, 64), (12, 2, 128)],
                         ids=["Llama-3.2-1B", "falcon-7b", "Qwen2.5-1.5B"])
def test_cudnn_reads_grouped_keys_at_their_own_heads_as_eager_reads_them_expanded(hq, hk, d, monkeypatch):
    """The GPU's check of what ``THUNDER_FUSER_GQA=auto`` leaves off on CUDA: with it at 1,
    cuDNN's call with fewer K/V heads gives eager's (expanded) loss and gradients, bf16, at
    the zoo models' head counts."""
    monkeypatch.setenv("THUNDER_FUSER_GQA", "1")
    torch.manual_seed(5)
    module = _Attention(hq, hk, d, "repeat_interleave").to(device="cuda", dtype=torch.bfloat16)
    jm = _step(module, torch.randn(2, 512, 32, device="cuda", dtype=torch.bfloat16))
    assert _attention_heads(thunder.last_traces(jm)[-1]) == [(hq, hk)]


@pytest.mark.cuda
def test_on_cuda_the_default_leaves_grouped_keys_expanded_until_a_gpu_run_checks_cudnn():
    torch.manual_seed(6)
    module = _Attention(8, 2, 64, "repeat_interleave").to(device="cuda", dtype=torch.bfloat16)
    jm = _step(module, torch.randn(2, 128, 32, device="cuda", dtype=torch.bfloat16))
    assert _attention_heads(thunder.last_traces(jm)[-1]) == [(8, 8)]


def test_a_value_sliced_from_a_fused_projection_is_saved_as_its_own_copy_not_as_a_view_of_all():
    """V at its own heads is a slice of the fused K/V projection; saved for the backward as a
    view it would hold the whole projection output (litgpt's fused q/k/v: 6 times V in
    Llama-3.2-1B). The region copies it (one write of V's size, where the expansion wrote g
    times that), so every saved K/V-shaped tensor owns its storage."""
    torch.manual_seed(7)
    module = _Attention(4, 2, 16, "repeat_interleave")
    x = torch.randn(2, 24, 32)
    jm = thunder.jit(module, executors=thunder_fuser.executors())
    jm(x).backward()
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved = []

    def pack(t):
        if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in params:
            saved.append((tuple(t.shape), t.untyped_storage().nbytes() // t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = jm(x)
    loss.backward()
    kv = [(shape, held) for shape, held in saved if shape == (2, 2, 24, 16)]
    assert len(kv) == 2 and all(held == 2 * 2 * 24 * 16 for _, held in kv), saved


@pytest.mark.parametrize("fill", ["nan", "inf", "huge"])
def test_nan_inf_and_huge_inputs_give_what_the_expanded_call_gives(fill, monkeypatch):
    """Rule on against rule off (the expanded call), fp32: loss and gradients equal with NaN
    and inf where the other has them, for a NaN, an inf or a 1e30 in the input."""
    torch.manual_seed(8)
    module = _Attention(4, 2, 16, "repeat_interleave")
    x = torch.randn(2, 24, 32)
    x[1, 5, 3] = {"nan": float("nan"), "inf": float("inf"), "huge": 1e30}[fill]
    results = []
    for setting in ("auto", "0"):
        monkeypatch.setenv("THUNDER_FUSER_GQA", setting)
        m, xi = copy.deepcopy(module), x.clone().requires_grad_()
        loss = thunder.jit(m, executors=thunder_fuser.executors())(xi)
        loss.backward()
        results.append([loss.detach(), xi.grad] + [p.grad for p in m.parameters()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, equal_nan=True)


def test_keys_and_values_that_are_views_of_one_argument_keep_eagers_values_and_the_argument():
    """K and V sliced from one caller tensor (aliased operands), expanded: values, gradients
    and the caller's tensor as eager's."""
    def f(q, kv):
        k, v = kv[..., :16], kv[..., 16:]
        k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(9)
    q, kv = torch.randn(2, 4, 12, 16), torch.randn(2, 2, 12, 32)
    before = kv.clone()
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    args, eager_args = [[t.clone().requires_grad_() for t in (q, kv)] for _ in range(2)]
    got, want = jf(*args), f(*eager_args)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, args, g), torch.autograd.grad(want, eager_args, g))
    assert torch.equal(kv, before)
    assert _attention_heads(thunder.last_traces(jf)[-1]) == [(4, 2)]
