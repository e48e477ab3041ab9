"""A saved tensor that pointwise ops make from values saved anyway is made again in the
backward, not held from the forward (``passes/recompute_in_backward.py``): what the forward
saves, gradients against eager, and the rule's limits (in-place writes, costlier inputs)."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import thunder
import torch
import torch.nn.functional as F
from hypothesis import given, settings

import thunder_fuser
from helpers import check_gradients


def _saved(jfn) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of each tensor the forward saves for the backward."""
    ret = thunder.last_traces(jfn)[-1].bound_symbols[-1]
    tensors, _ = ret.args[1]
    return sorted(((tuple(t.shape), thunder.torch.to_torch_dtype(t.dtype)) for t in tensors), key=str)


def _saved_bytes(jfn) -> int:
    return sum(torch.Size(s).numel() * d.itemsize for s, d in _saved(jfn))


def _swiglu(x, w1, w2, w3):
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w2), w3)


def _swiglu_args(dtype=torch.float32):
    x = torch.randn(16, 32, dtype=dtype)
    return x, [torch.randn(96, 32, dtype=dtype) / 6, torch.randn(96, 32, dtype=dtype) / 6,
               torch.randn(32, 96, dtype=dtype) / 10]


def _jit_and_step(fn, x, params):
    jfn = thunder.jit(fn, executors=thunder_fuser.executors())
    ref = [t.detach().clone().requires_grad_() for t in (x, *params)]
    ours = [t.detach().clone().requires_grad_() for t in (x, *params)]
    out = jfn(*ours)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected = fn(*ref)
    expected.backward(grad)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-4, rtol=1e-4)
    return jfn


def test_the_swiglu_product_is_made_again_for_the_weight_gradient(monkeypatch):
    """``silu(fc1) * fc2`` feeds the down projection, whose weight gradient (a matmul) reads
    it: saved it was one more ``[tokens, hidden]`` beside ``fc1`` and ``fc2``."""
    x, params = _swiglu_args()
    jfn = check_gradients(_swiglu, x, params)
    hidden = [s for s, _ in _saved(jfn) if s == (16, 96)]
    assert len(hidden) == 2  # fc1 and fc2, not their product
    monkeypatch.setenv("THUNDER_FUSER_RECOMPUTE", "0")
    before = check_gradients(_swiglu, *_swiglu_args())
    assert len([s for s, _ in _saved(before) if s == (16, 96)]) == 3
    assert _saved_bytes(jfn) < _saved_bytes(before)


def test_bf16_recomputed_values_are_the_forwards_bit_for_bit():
    """The clone repeats the forward's prims with each rounding as traced: the weight
    gradient read from it equals the one eager computes from the forward's product."""
    x, params = _swiglu_args(torch.bfloat16)
    ours = [t.detach().clone().requires_grad_() for t in (x, *params)]
    ref = [t.detach().clone().requires_grad_() for t in (x, *params)]
    jfn = thunder.jit(_swiglu, executors=thunder_fuser.executors())
    out = jfn(*ours)
    grad = torch.randn_like(out)
    out.backward(grad)
    h = F.silu(F.linear(ref[0], ref[1])) * F.linear(ref[0], ref[2])
    torch.testing.assert_close(ours[3].grad, (grad.t() @ h).detach(), rtol=0, atol=0)


def _grouped_query(q, k, v, wo):
    """K and V of 2 heads expanded to the 8 of Q, as litgpt and transformers repeat them."""
    b, hk, t, d = k.shape
    k = k[:, :, None].expand(b, hk, 4, t, d).reshape(b, hk * 4, t, d)
    v = v[:, :, None].expand(b, hk, 4, t, d).reshape(b, hk * 4, t, d)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return y.transpose(1, 2).reshape(b, t, -1) @ wo


def test_grouped_query_k_and_v_expanded_by_views_alone_stay_saved(monkeypatch):
    """K and V expanded to every head are views alone, which the backward leaves to torch
    between its matmuls: made again there they would be a torch copy outside our regions,
    so the forward saves what it saved before."""
    q, k, v = torch.randn(2, 8, 16, 8), torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8)
    wo = torch.randn(64, 64) / 8
    jfn = _jit_and_step(_grouped_query, q, [k, v, wo])
    monkeypatch.setenv("THUNDER_FUSER_RECOMPUTE", "0")
    before = _jit_and_step(_grouped_query, q, [k, v, wo])
    assert _saved(jfn) == _saved(before)


def _scaled_in_place(x, w, buf):
    h = torch.sigmoid(x @ w) * torch.exp(buf)
    buf.add_(1)
    return h @ w.t()


def test_a_trace_that_writes_in_place_saves_what_it_did():
    """Made again after ``buf.add_``, ``exp(buf)`` would read the new ``buf``: a trace with
    an in-place write is left as it is, and its gradients are eager's."""
    x, w, buf = torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True), torch.randn(8, 16)
    ref = [t.detach().clone().requires_grad_(t.requires_grad) for t in (x, w, buf)]
    jfn = thunder.jit(_scaled_in_place, executors=thunder_fuser.executors())
    out = jfn(x, w, buf)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected = _scaled_in_place(*ref)
    expected.backward(grad)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(buf, ref[2])
    for a, b in zip((x, w), ref[:2]):
        torch.testing.assert_close(a.grad, b.grad)


_UNARY = [torch.sigmoid, torch.tanh, lambda t: torch.exp(torch.tanh(t)), lambda t: t * 0.5, torch.neg, F.silu, F.gelu]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, len(_UNARY) - 1), min_size=1, max_size=4), st.booleans(), st.booleans())
def test_pointwise_chains_into_a_matmul_keep_their_gradients_and_save_no_more(chain, mix, bf16):
    """Random pointwise chains between matmuls: the same output and gradients as without
    the pass, bit for bit (near eager's), and never more saved."""
    dtype = torch.bfloat16 if bf16 else torch.float32

    def fn(x, w1, w2, w3):
        a, b = x @ w1, x @ w2
        h = a
        for i in chain:
            h = _UNARY[i](h)
        if mix:
            h = h * b
        return h @ w3

    gen = torch.Generator().manual_seed(len(chain) * 97 + sum(chain) * 7 + 2 * mix + bf16)
    x = torch.randn(8, 16, generator=gen).to(dtype)
    params = [(torch.randn(16, 16, generator=gen) / 4).to(dtype) for _ in range(3)]
    grad = torch.randn(8, 16, generator=gen).to(dtype)

    def step(f, as_dtype=None):
        args = [t.detach().clone().to(as_dtype or t.dtype).requires_grad_() for t in (x, *params)]
        out = f(*args)
        out.backward(grad.to(out.dtype))
        return f, [out.detach()] + [a.grad for a in args]

    jfn, ours = step(thunder.jit(fn, executors=thunder_fuser.executors()))
    with pytest.MonkeyPatch().context() as m:
        m.setenv("THUNDER_FUSER_RECOMPUTE", "0")
        before, theirs = step(thunder.jit(fn, executors=thunder_fuser.executors()))
    _, eager = step(fn)
    _, exact = step(fn, torch.float64)
    for a, b, c, e in zip(ours, theirs, eager, exact):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        if a is None:  # w2 without ``mix``
            assert c is None
        elif bf16:  # eager rounds to bf16 after every op, we fewer times: no further from fp64's
            err = lambda t: (t.double() - e).norm()  # noqa: E731
            assert err(a) <= 1.5 * err(c) + 1e-2 * e.norm()
        else:
            torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)
    assert _saved_bytes(jfn) <= _saved_bytes(before)


@pytest.mark.parametrize("model", ["Llama-3.2-1B", "pythia-410m", "hf-Qwen2", "hf-GPT2"])
def test_zoo_models_hold_less_for_their_backward(model, monkeypatch):
    """The zoo's tiny configs (litgpt's and transformers' own code): a step holds less for
    its backward than with the pass off (SwiGLU's product, a norm's output before a
    projection, a GELU's output before the down projection)."""
    from benchmarks.saved_bytes import saved_bytes

    held = saved_bytes(model, 2, "thunder+fuser", 32, "cpu", torch.float32, tiny=True)
    monkeypatch.setenv("THUNDER_FUSER_RECOMPUTE", "0")
    before = saved_bytes(model, 2, "thunder+fuser", 32, "cpu", torch.float32, tiny=True)
    assert held < before


def _rms_then_two_projections(x, w, p, q):
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return F.linear(h, p) + F.linear(h, q)


def _gelu_mlp(x, w1, w2, b):
    return F.linear(F.gelu(F.linear(x, w1) + b, approximate="tanh"), w2)


def _params(dtype):
    return [torch.randn(96, 32, dtype=dtype) / 6, torch.randn(96, 32, dtype=dtype) / 6,
            torch.randn(32, 96, dtype=dtype) / 10]


def _nan_inf(x):
    x = x.clone()
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), -float("inf")
    return x


torch.manual_seed(0)  # the cases' tensors: the same in every worker and order
_w = torch.randn(96, 32) / 6
_ATTACKS = {
    **{f"swiglu {d}": (_swiglu, [torch.randn(16, 32, dtype=d), *_params(d)])
       for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)},
    "norm then two projections bf16": (_rms_then_two_projections, [torch.randn(16, 32, dtype=torch.bfloat16),
                                       *(torch.randn(*s, dtype=torch.bfloat16) for s in ((32,), (8, 32), (8, 32)))]),
    "tanh-gelu mlp fp16": (_gelu_mlp, [torch.randn(16, 32, dtype=torch.float16), _params(torch.float16)[0],
                                        _params(torch.float16)[2], torch.randn(96, dtype=torch.float16)]),
    "nan and inf": (_swiglu, [_nan_inf(torch.randn(16, 32)), *_params(torch.float32)]),
    "transposed input": (_swiglu, [torch.randn(32, 16).t(), *_params(torch.float32)]),
    "3-d batch": (_swiglu, [torch.randn(2, 8, 32), *_params(torch.float32)]),
    "no tokens": (_swiglu, [torch.randn(0, 32), *_params(torch.float32)]),
    "many tokens": (_swiglu, [torch.randn(4096, 32), *_params(torch.float32)]),
    "one weight for both projections": (lambda x, a, b, c: _swiglu(x, a, a, c), [torch.randn(16, 32), _w, _w,
                                                                                 _params(torch.float32)[2]]),
    "0-d factors": (lambda x, w, s, t: ((torch.tanh(x @ w) * s) @ w.t()) * t,
                    [torch.randn(8, 16), torch.randn(16, 16) / 4, torch.tensor(1.5), torch.tensor(-2.0)]),
}


@pytest.mark.parametrize("case", list(_ATTACKS))
def test_tried_to_break_it(case, monkeypatch):
    """dtypes, NaN and inf, strides, an empty and a long token dim, one tensor passed twice,
    0-d operands: output, strides and every gradient bit for bit as with the pass off,
    near eager's, and no input changed."""
    fn, args = _ATTACKS[case]
    # near eager's: ours rounds once where eager rounds each op (a bf16 weight's gradient sums 16 rows)
    tol = {torch.bfloat16: 2e-1, torch.float16: 2e-2}.get(args[0].dtype, 1e-4)

    def step(f):
        ins = [a.detach().clone().requires_grad_() for a in args]
        out = f(*ins)
        out.backward(torch.ones_like(out))
        return [out.detach(), *(a.grad for a in ins)], out.stride(), ins

    ours, strides, ins = step(thunder.jit(fn, executors=thunder_fuser.executors()))
    monkeypatch.setenv("THUNDER_FUSER_RECOMPUTE", "0")
    off, _, _ = step(thunder.jit(fn, executors=thunder_fuser.executors()))
    eager, eager_strides, _ = step(fn)
    assert strides == eager_strides
    for a, b, c in zip(ours, off, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(a, c, rtol=tol, atol=tol, equal_nan=True)
    for a, b in zip(ins, args):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0, equal_nan=True)
