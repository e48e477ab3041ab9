"""Ops thunder registers automatically, as thunder + fuser runs them
(``patches/auto_registered_ops.py``): ``torch.addmm``, ``addmv`` and ``addbmm``, forward and
gradients as eager's for every form users write (function or method, ``beta``/``alpha``, an
input broadcast or full), traced as thunder's own matmul and add; the dtype conversion
methods as ``to``; and no zoo model's trace holding an automatically registered op (an
opaque torch call whose backward computes the forward again)."""

from __future__ import annotations

import pytest
import thunder
import torch
from hypothesis import given, settings, strategies as st

import thunder_fuser
from thunder_fuser.patches.auto_registered_ops import CONVERSIONS

SHAPES = {  # name: (input, a, b) shapes
    "addmm": ((5,), (4, 3), (3, 5)),
    "addmv": ((4,), (4, 3), (3,)),
    "addbmm": ((4, 5), (2, 4, 3), (2, 3, 5)),
}


def _call(name, method, inp, a, b, **kw):
    return getattr(inp, name)(a, b, **kw) if method else getattr(torch, name)(inp, a, b, **kw)


def _inputs(name, seed, input_shape=None):
    g = torch.Generator().manual_seed(seed)
    shapes = SHAPES[name]
    shapes = (input_shape or shapes[0],) + shapes[1:]
    return [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in shapes]


def _check(name, method, kw, input_shape=None, seed=0):
    def f(inp, a, b):
        return _call(name, method, inp, a, b, **kw)

    ours, theirs = _inputs(name, seed, input_shape), _inputs(name, seed, input_shape)
    before = [t.detach().clone() for t in ours]
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    got, want = jf(*ours), f(*theirs)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    for o, t, b in zip(ours, theirs, before):
        torch.testing.assert_close(o.detach(), b)  # no input changed
        torch.testing.assert_close(o.grad, t.grad)
    traces = str(thunder.last_traces(jf)[-1]) + str(thunder.last_backward_traces(jf)[-1])
    assert "_vjp" not in traces and f"{name}(" not in traces.replace(f"ltorch.{name}(", ""), traces
    return traces


@pytest.mark.parametrize("method", [False, True], ids=["function", "method"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_matmul_adds_match_eager_as_thunders_matmul_and_add(name, method):
    traces = _check(name, method, {})
    assert "matmul" in traces


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(list(SHAPES)), beta=st.sampled_from([1, 0.5, -2.0]),
       alpha=st.sampled_from([1, 0.25, 3]), seed=st.integers(0, 2**16))
def test_beta_and_alpha_scale_as_eagers(name, beta, alpha, seed):
    _check(name, False, dict(beta=beta, alpha=alpha), seed=seed)


def test_addmm_input_broadcasts_from_a_row_or_a_column_as_eagers():
    for shape in ((1, 5), (4, 1), (4, 5)):
        _check("addmm", False, {}, input_shape=shape)


def test_beta_zero_ignores_the_input_as_torch_documents():
    """torch: with ``beta=0`` the input is ignored, a NaN in it does not reach the result."""
    def f(inp, a, b):
        return torch.addmm(inp, a, b, beta=0)

    inp = torch.full((5,), float("nan"), dtype=torch.float64)
    a, b = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    got = thunder.jit(f, executors=thunder_fuser.executors())(inp, a, b)
    torch.testing.assert_close(got, f(inp, a, b))
    assert not got.isnan().any()


def test_gpt2s_conv1d_bias_gradient_is_a_column_sum_of_ours():
    """transformers' ``Conv1D`` (GPT-2's every projection) is an ``addmm``: its bias's gradient
    lands in one of our regions, not in a torch sum outside them."""
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    lin = Conv1D(6, 4)
    x = torch.randn(3, 5, 4, requires_grad=True)
    jm = thunder.jit(lin, executors=thunder_fuser.executors())
    out = jm(x)
    out.sum().backward()
    want_w, want_b = lin.weight.grad.clone(), lin.bias.grad.clone()
    lin.zero_grad()
    lin(x.detach()).sum().backward()
    torch.testing.assert_close(want_w, lin.weight.grad)
    torch.testing.assert_close(want_b, lin.bias.grad)
    bw = thunder.last_backward_traces(jm)[-1]
    outside = [b.sym.name for b in bw.bound_symbols if b.sym.name in ("sum", "addmm_vjp")]
    assert not outside, outside


def _auto_registered(traces) -> set:
    from thunder.core import prims

    found, todo = set(), [b for tr in traces for b in tr.bound_symbols]
    while todo:
        b = todo.pop()
        if prims.OpTags.AUTO_REGISTERED in (b.sym.tags or ()):
            found.add(b.sym.name)
        todo.extend(b.subsymbols)
    return found


@pytest.mark.parametrize("name", list(CONVERSIONS))
def test_dtype_conversion_methods_are_thunders_to(name):
    def f(x):
        return getattr(x * 2, name)() * 1

    x = torch.randn(4, 6, dtype=torch.float32).mul(3).requires_grad_(CONVERSIONS[name].is_floating_point)
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    got, want = jf(x), f(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    traces = thunder.last_traces(jf)
    if x.requires_grad:
        got.sum().backward()
        gx = x.grad.clone()
        x.grad = None
        want.sum().backward()
        torch.testing.assert_close(gx, x.grad)
        traces = traces + thunder.last_backward_traces(jf)
    assert not _auto_registered(traces)


def test_no_zoo_model_traces_an_automatically_registered_op():
    """Every zoo model (tiny, one layer, CPU): forward and backward hold no op of thunder's
    automatic registration. hf-GPT2's addmm and the sliding-window masks' ``.bool()`` did."""
    from benchmarks import model_zoo, zoo

    found = {}
    for name in zoo.ZOO:
        built = model_zoo.build(name, layers=1, tiny=True, dtype=torch.float32)
        jm = thunder.jit(built.module, executors=thunder_fuser.executors())
        jm(*model_zoo.batch(built, 2, 16)).backward()
        ops = _auto_registered(thunder.last_traces(jm)[:1] + thunder.last_backward_traces(jm)[-1:])
        if ops:
            found[name] = sorted(ops)
    assert not found, found
