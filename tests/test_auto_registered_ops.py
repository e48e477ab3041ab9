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
    "baddbmm": ((2, 4, 5), (2, 4, 3), (2, 3, 5)),
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


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_zero_factor_ignores_its_term_and_gives_it_zero_gradients(name):
    """beta=0 ignores a NaN input, alpha=0 an inf product (BLAS's rule, torch's, but for
    torch's own baddbmm, which multiplies it by 0); the ignored term's gradient is zeros as
    torch gives, not None (an optimizer skips None). transformers' older attention passes
    ``torch.empty`` as baddbmm's input with beta=0."""
    for kw, poisoned in ((dict(beta=0), 0), (dict(alpha=0), 1)):
        def f(inp, a, b, kw=kw):
            return getattr(torch, name)(inp, a, b, **kw)

        args = _inputs(name, 3)
        with torch.no_grad():
            args[poisoned].fill_(float("nan") if poisoned == 0 else float("inf"))
        theirs = [t.detach().clone().requires_grad_() for t in args]
        got, want = thunder.jit(f, executors=thunder_fuser.executors())(*args), f(*theirs)
        torch.testing.assert_close(got, want, equal_nan=True)
        assert got.isfinite().all() or (name, poisoned) == ("baddbmm", 1)
        g = torch.randn_like(want)
        got.backward(g)
        want.backward(g)
        for o, t in zip(args, theirs):
            assert o.grad is not None
            torch.testing.assert_close(o.grad, t.grad, equal_nan=True)


def test_odd_inputs_as_eagers():
    """a 0-d input, an input sliced with strides, transposed operands, an input that is an
    operand, bf16 and huge values (seeded: where the huge case's sum of 1e36-sized terms
    cancels, the order of the additions moves the result by terms' rounding, so it is
    compared at that scale)."""
    g = torch.Generator().manual_seed(11)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    cases = {
        "0-d input": (lambda i, a, b: torch.addmm(i, a, b), r(()), r(4, 3), r(3, 5)),
        "strided input": (lambda i, a, b: torch.addmm(i[:, ::2], a, b), r(4, 10), r(4, 3), r(3, 5)),
        "transposed operands": (lambda i, a, b: torch.addmm(i, a.t(), b.t()), r(5), r(3, 4), r(5, 3)),
        "bf16": (lambda i, a, b: torch.addmm(i, a, b), r(5).bfloat16(), r(64, 32).bfloat16(), r(32, 5).bfloat16()),
        "huge": (lambda i, a, b: torch.addmm(i, a, b), r(5) * 1e30, r(4, 3) * 1e18, r(3, 5) * 1e18),
        "aliased": (lambda x: torch.addmm(x, x, x.t()), r(4, 4)),
    }
    for why, (f, *args) in cases.items():
        ours = [t.clone().requires_grad_() for t in args]
        theirs = [t.clone().requires_grad_() for t in args]
        got, want = thunder.jit(f, executors=thunder_fuser.executors())(*ours), f(*theirs)
        tol = dict(rtol=2e-2, atol=2e-2) if want.dtype == torch.bfloat16 else {}
        at_scale = dict(rtol=1.3e-6, atol=1e36 * 1e-6) if why == "huge" else tol
        torch.testing.assert_close(got, want, **at_scale, msg=why)
        g = torch.ones_like(want)
        got.backward(g)
        want.backward(g)
        for o, t in zip(ours, theirs):
            torch.testing.assert_close(o.grad, t.grad, **tol, msg=why)


def test_operands_of_two_dtypes_are_refused_as_torch_refuses_them():
    def f(i, a, b):
        return torch.addmm(i, a, b)

    args = torch.randn(5, dtype=torch.float64), torch.randn(4, 3), torch.randn(3, 5)
    with pytest.raises(RuntimeError, match="addmm: the input and both operands must have one dtype"):
        thunder.jit(f, executors=thunder_fuser.executors())(*args)


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


def test_a_conversion_keeps_the_memory_format_it_is_asked_for():
    """``x.double(memory_format=torch.channels_last)``: thunder's ``to`` drops the format
    when it converts; eager's strides."""
    def f(x):
        return x.double(memory_format=torch.channels_last) * 2

    x = torch.randn(2, 3, 4, 5)
    got, want = thunder.jit(f, executors=thunder_fuser.executors())(x), f(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


def _tiny_litgpt_config(name: str):
    """The tiny zoo's litgpt config of ``name`` as a comparable value, but its name; None for
    a model of another library."""
    import dataclasses

    from benchmarks import model_zoo

    if name not in model_zoo.LITGPT + model_zoo.MORE_LITGPT + model_zoo.ZOO_LITGPT:
        return None
    cfg = model_zoo.litgpt_config(name, 1, tiny=True)
    return repr(sorted((k, v) for k, v in dataclasses.asdict(cfg).items() if k not in ("name", "hf_config")))


def _zoo_names():
    from benchmarks import zoo

    return list(zoo.ZOO)


@pytest.mark.parametrize("name", _zoo_names())
def test_no_zoo_model_traces_an_automatically_registered_op(name):
    """Every zoo model (tiny, one layer, CPU): forward and backward hold no op of thunder's
    automatic registration. hf-GPT2's addmm and the sliding-window masks' ``.bool()`` did. A
    model whose tiny config is an earlier one's but for its name (pythia-410m's is
    pythia-1b's) traces that model's program and is not traced again."""
    from benchmarks import model_zoo

    names = _zoo_names()
    mine = _tiny_litgpt_config(name)
    same = [other for other in names[:names.index(name)] if mine is not None and _tiny_litgpt_config(other) == mine]
    if same:
        pytest.skip(f"{name}'s tiny config is {same[0]}'s")
    built = model_zoo.build(name, layers=1, tiny=True, dtype=torch.float32)
    jm = thunder.jit(built.module, executors=thunder_fuser.executors())
    jm(*model_zoo.batch(built, 2, 16)).backward()
    ops = _auto_registered(thunder.last_traces(jm)[:1] + thunder.last_backward_traces(jm)[-1:])
    assert not ops, sorted(ops)
