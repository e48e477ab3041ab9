"""Regressions of an attack on the executor: programs that once gave a silently wrong
result, lost a gradient or crashed where eager runs. Each runs on the default CPU backend
and on the lowered kernel programs (``THUNDER_FUSER_KERNELS=torch``, what CUDA runs), and
compares with eager on values, dtypes and every input the program writes."""

from __future__ import annotations

import math

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser
from thunder_fuser import fuser_ex
from tests.helpers import BOOL_STORES, check_vs_eager


@pytest.fixture(params=["reference", "lowered"])
def backend(request, monkeypatch):
    if request.param == "lowered":
        monkeypatch.setenv("THUNDER_FUSER_KERNELS", "torch")
    return request.param


def _same(got, want):
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        torch.testing.assert_close(got, want, equal_nan=True)
    else:
        for g, w in zip(got, want, strict=True):
            _same(g, w)


def test_a_slice_of_a_value_computed_from_a_tensor_written_later_reads_the_old_values(backend):
    """A kernel computes ``r = x * 2`` again wherever its consumers read it: the slices of
    ``r`` read ``x`` at other elements, so they may not share the kernel that zeroes ``x``."""
    def f(x):
        r = x * 2.0
        d = r[:, 1:] - r[:, :-1]
        x.zero_()
        return r, d

    check_vs_eager(f, torch.arange(12.0).reshape(3, 4))
    check_vs_eager(lambda x: (x.sum(0), x.zero_()), torch.randn(3, 4))


@pytest.mark.parametrize("write", [
    lambda w: w[0].mul_(2.0), lambda w: w.t().add_(1.0), lambda w: w.view(-1).zero_(), lambda w: w[0].add_(1.0),
    lambda w: w.mul_(2.0),
], ids=["index-mul_", "t-add_", "view-zero_", "index-add_", "mul_"])
def test_an_in_place_write_into_a_leaf_that_requires_grad_raises_as_eager(backend, write):
    def f(w):
        write(w)
        return w.sum()

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad is being used in an in-place"):
        f(torch.ones(2, 3, requires_grad=True))
    w = torch.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad is being used in an in-place"):
        thunder.jit(f, executors=[fuser_ex])(w)
    assert torch.equal(w, torch.ones(2, 3))
    with torch.no_grad():  # an optimizer's update: allowed, as in eager
        jw = torch.ones(2, 3, requires_grad=True)
        thunder.jit(f, executors=[fuser_ex])(jw)
        ew = torch.ones(2, 3, requires_grad=True)
        f(ew)
        assert torch.equal(jw, ew)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_a_loss_whose_every_target_is_ignored_has_a_zero_gradient(backend, reduction):
    x = torch.randn(4, 5, requires_grad=True)
    target = torch.full((4,), -100)
    jf = thunder.jit(lambda x, t: F.cross_entropy(x, t, reduction=reduction), executors=thunder_fuser.executors())
    loss = jf(x, target)
    loss.backward()
    x2 = x.detach().clone().requires_grad_()
    want = F.cross_entropy(x2, target, reduction=reduction)
    want.backward()
    _same(loss.detach(), want.detach())
    _same(x.grad, x2.grad)


def test_relu_keeps_nan_as_eager_forward_and_backward(backend):
    x = torch.tensor([float("nan"), 1.0, -1.0, 0.0, float("inf")])
    check_vs_eager(torch.relu, x)
    check_vs_eager(F.relu, x.reshape(1, 5))
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    jf = thunder.jit(lambda x: torch.relu(x * 2.0), executors=thunder_fuser.executors())
    outs = [jf(xs[0]), torch.relu(xs[1] * 2.0)]
    for o in outs:
        o.backward(torch.arange(5.0))
    _same(outs[0].detach(), outs[1].detach())
    _same(xs[0].grad, xs[1].grad)


def test_log_softmax_of_a_row_with_an_infinity_is_nan_as_eager(backend):
    x = torch.tensor([[float("inf"), 1.0, -2.0], [1.0, 2.0, 3.0], [-float("inf"), 0.0, 1.0]])
    check_vs_eager(lambda x: torch.log_softmax(x, -1), x)
    check_vs_eager(lambda x: F.log_softmax(x, 0, dtype=torch.float64), x)


@pytest.mark.parametrize("f", [
    lambda a, b: a.reshape(1, 1) + b, lambda a, b: a.unsqueeze(0) + b, lambda a, b: a.expand(2) * b,
    lambda a, b: torch.minimum(a.expand(2), b), lambda a, b: a + b,
], ids=["reshape", "unsqueeze", "expand", "minimum", "0-d"])
def test_a_view_of_a_0d_tensor_with_dims_promotes_as_a_tensor_with_dims(backend, f):
    a = torch.tensor(1.5, dtype=torch.bfloat16)
    b = torch.tensor(2.25)
    got = thunder.jit(f, executors=[fuser_ex])(a, b)
    _same(got, f(a, b))


@pytest.mark.parametrize("op", ["add", "sub"])
def test_alpha_scales_in_the_promoted_dtype_and_rounds_once(backend, op):
    fn = getattr(torch, op)
    a = torch.randn(256)
    b = torch.randn(256, dtype=torch.bfloat16)
    got = thunder.jit(lambda a, b: fn(a, b, alpha=-1.5), executors=[fuser_ex])(a, b)
    assert torch.equal(got, fn(a, b, alpha=-1.5))
    c = torch.randn(256, dtype=torch.bfloat16)
    got = thunder.jit(lambda b, c: fn(b, c, alpha=0.3), executors=[fuser_ex])(b, c)
    assert torch.equal(got, fn(b, c, alpha=0.3))
    check_vs_eager(lambda a, b: getattr(a, op + "_")(b, alpha=-1.5), a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_number_to_a_tensors_powers_is_torchs_in_value_and_layout(backend, dtype):
    """``pow(0.9, x)``: torch reads the number in the result's dtype (bf16's 0.8984375) and
    returns a contiguous result whatever ``x``'s layout (found through ``_foreach_pow(beta,
    steps)``, which an optimizer calls: one ulp off in 16 bits, and a transposed layout)."""
    x = torch.randn(64, 48).to(dtype).t()
    for f in (lambda x: torch.pow(0.9, x), lambda x: 0.7 ** (x * 2)):
        got = thunder.jit(f, executors=[fuser_ex])(x)
        want = f(x)
        assert torch.equal(got, want) and got.stride() == want.stride(), (got.stride(), want.stride())


@pytest.mark.parametrize("scales", [(3.0, 3.0), (3.0, 0.5), (1.0, 1.0)])
def test_a_second_backward_through_a_retained_loss_graph_is_right(backend, scales):
    """The two-pass loss scales its saved gradient in place; a second backward scales it
    from the first one's cotangent to its own (and torch's version check does not fire)."""
    def f(x, w, t):
        return F.cross_entropy(x @ w, t)

    x, w, t = torch.randn(4, 8), torch.randn(8, 5), torch.randint(0, 5, (4,))
    grads = []
    for fn in (thunder.jit(f, executors=thunder_fuser.executors()), f):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = fn(xs, ws, t)
        (loss * scales[0]).backward(retain_graph=True)
        (loss * scales[1]).backward()
        grads.append((xs.grad, ws.grad))
    _same(grads[0], grads[1])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_loss_over_positions_takes_its_gradient_in_the_logits_shape(backend, reduction):
    """Logits ``[N, C, d]`` with targets ``[N, d]`` (segmentation's layout)."""
    x = torch.randn(3, 10, 4)
    t = torch.randint(0, 10, (3, 4))
    grads = []
    for fn in (thunder.jit(F.cross_entropy, executors=thunder_fuser.executors()), F.cross_entropy):
        xs = x.clone().requires_grad_()
        loss = fn(xs, t, reduction=reduction)
        loss.sum().backward()
        grads.append((loss.detach(), xs.grad))
    _same(grads[0], grads[1])


class _Marked(torch.Tensor):
    pass


def test_a_sparse_or_subclass_input_runs_as_torch_runs_it(backend):
    jf = thunder.jit(lambda x: x * 2.0 + 1.0, executors=[fuser_ex])
    plain = torch.randn(3, 3)
    _same(jf(plain), plain * 2.0 + 1.0)
    _same(jf(plain), plain * 2.0 + 1.0)  # the straight-line code, then another kind of tensor
    marked = torch.randn(3, 3).as_subclass(_Marked)
    got = jf(marked)
    assert type(got) is _Marked and torch.equal(got.as_subclass(torch.Tensor), (marked * 2.0 + 1.0).as_subclass(torch.Tensor))
    sparse = torch.randn(3, 3).to_sparse()
    got = thunder.jit(lambda x: x * 2.0, executors=[fuser_ex])(sparse)
    assert got.layout is torch.sparse_coo and torch.equal(got.to_dense(), sparse.to_dense() * 2.0)


def test_copying_a_tensor_onto_itself_is_nothing_to_write(backend):
    x = torch.randn(1, 4).expand(3, 4)
    check_vs_eager(lambda x: x.copy_(x), x)
    check_vs_eager(lambda x: x.copy_(x) + 1.0, torch.randn(3, 4))


@pytest.mark.filterwarnings("ignore:The 'symbolic values' cache option")
@pytest.mark.parametrize("f", [lambda x: F.pad(x, (1, 1)) + 1, lambda x: torch.cat([x, x * 2.0]) + 1],
                         ids=["pad", "cat"])
def test_symbolic_shapes_are_left_to_thunder(backend, f):
    """thunder's ``cache="symbolic values"`` reuses a trace for other extents: a region's plan
    is built for one shape, so such shapes are not claimed."""
    jf = thunder.jit(f, executors=[fuser_ex], cache="symbolic values")
    for n in (3, 5):
        x = torch.randn(n, 4)
        _same(jf(x), f(x))


def _cl(shape):
    return torch.randn(shape).to(memory_format=torch.channels_last)


def _permuted(shape, order):
    return torch.randn([shape[d] for d in order]).permute(sorted(range(len(order)), key=lambda i: order[i]))


@pytest.mark.parametrize("case", [
    ("channels-last times contiguous", lambda a, b: a * b, lambda: (_cl((2, 3, 4, 5)), torch.randn(2, 3, 4, 5))),
    ("contiguous times channels-last", lambda a, b: a * b, lambda: (torch.randn(2, 3, 4, 5), _cl((2, 3, 4, 5)))),
    ("two permutations", lambda a, b: a + b, lambda: (_cl((2, 3, 4, 5)), _permuted((2, 3, 4, 5), (0, 2, 1, 3)))),
    ("two permutations swapped", lambda a, b: a + b, lambda: (_permuted((2, 3, 4, 5), (0, 2, 1, 3)), _cl((2, 3, 4, 5)))),
    ("broadcast first", lambda a, b: a * b, lambda: (torch.randn(3, 1, 1), _cl((2, 3, 4, 5)))),
    ("softmax over channels", lambda a: torch.softmax(a, 1), lambda: (_cl((2, 3, 4, 5)),)),
    ("log_softmax", lambda a: torch.log_softmax(a, -1), lambda: (_cl((2, 3, 4, 5)),)),
    ("layer_norm", lambda a: F.layer_norm(a, (5,)), lambda: (_cl((2, 3, 4, 5)),)),
    ("a sum of channels-last", lambda a: (a * 2.0).sum(1), lambda: (_cl((2, 3, 4, 5)),)),
    ("a small sum between kept dims", lambda a: (a * 2.0).sum(1), lambda: (_permuted((2, 2, 2, 2), (0, 1, 3, 2)),)),
], ids=lambda c: c[0])
def test_outputs_are_laid_out_as_eager_lays_them_out(backend, case):
    _, f, make = case
    args = make()
    got = thunder.jit(f, executors=[fuser_ex])(*args)
    want = f(*args)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride()


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64])
def test_a_reduction_an_fp32_accumulator_would_round_is_left_to_torch(backend, dtype):
    """The reduction kernels accumulate in fp32: an fp64 sum there lost 29 bits (found on
    the H200 by the random programs), an integer sum past 2**24 rounds. A count of booleans
    below 2**24 is exact and stays on kernels."""
    from thunder_fuser import explain

    x = (torch.arange(24).reshape(4, 6) * 2**22 + 1).to(dtype)
    jfn, _ = check_vs_eager(lambda x: (x.sum(-1), x.sum(0), x.amax(-1)), x)
    if backend == "lowered":
        assert "the reduction kernels accumulate in fp32" in explain(jfn)
        assert _segments_on_kernels(jfn) and all("accumulate in fp32" in r for _, r in _segments_on_kernels(jfn))
    jfn, _ = check_vs_eager(lambda m: (m > 0).sum(-1), torch.randn(4, 6))
    if backend == "lowered":
        assert _segments_on_kernels(jfn) == []


@pytest.mark.cuda
@pytest.mark.parametrize("case", [
    ("a column sum", lambda x: x.sum(0), (8192, 64)),
    ("a long row split across blocks", lambda x: x.sum(), (1, 2**20)),
    ("a mean over columns", lambda x: x.mean(0), (8192, 64)),
], ids=lambda c: c[0])
def test_sums_over_infinities_on_cuda(case):
    """The partials' Kahan sum took (inf - v) - y as the rounding lost: NaN where eager
    sums to inf (found on the H200 by the random programs)."""
    _, f, shape = case
    x = torch.randint(-8, 8, shape, device="cuda").float()  # exact sums in any order
    x[-1, -1] = float("inf")
    x[0, 0] = float("inf")
    check_vs_eager(f, x)
    x[0, 1] = -float("inf")  # inf + -inf: NaN, as eager's
    check_vs_eager(f, x)


def test_a_reshape_of_a_value_computed_before_an_in_place_write_reads_the_old_values(backend):
    """``reshape(f(a))`` is computed as ``f(reshape(a))`` so that the op takes its reader's
    domain (``ir/reshape_first.py``); it moved the op to the reshape, after ``a.mul_``, and
    read the new ``a`` (found by the random programs on the H200; the CPU too)."""
    def f(a):
        t1 = torch.exp(-a.abs())
        a.mul_(2.0)
        a[..., :1].zero_()
        return t1.reshape(-1)

    check_vs_eager(f, torch.tensor([[0.5, -1.2], [2.0, 0.25]]))
    check_vs_eager(lambda a: (a.float(), a.mul_(3), a.float().reshape(-1))[::2], torch.randn(3, 4, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_view_of_a_value_torch_computes_has_eagers_strides(backend, dtype):
    """An output that views a value a segment on the reference backend computed (a
    log_softmax of fp64 values, which no kernel sums) took torch's layout for the ops of
    that segment, not the plan's (found by the random programs on the H200)."""
    def f(c):
        return torch.log_softmax(c * 2.0, 0).unsqueeze(0)

    c = torch.randn(3, 2, 5, dtype=dtype).permute(2, 1, 0)
    _, got = check_vs_eager(f, c)
    assert got.stride() == f(c).stride()


@pytest.mark.parametrize("f", [lambda a: a.amax(0), lambda a: a.amin(0).amin(1), lambda a: a.amax((0, 2))],
                         ids=["amax", "amin twice", "amax over two dims"])
def test_tied_maxima_share_the_gradient_as_eager(backend, f):
    """thunder's amax backward divides the cotangent by ``sum(a == max)``, a sum of booleans
    it types as a boolean and torch returns as the count: typed bool here, each of five
    tied maxima got the whole cotangent (found by the random programs on the H200)."""
    grads, a0 = [], torch.randn(1, 5, 4, 2).expand(5, 5, 4, 2).contiguous()
    for fn in (thunder.jit(f, executors=thunder_fuser.executors()), f):
        a = a0.clone().requires_grad_()
        fn(a).sum().backward()
        grads.append(a.grad)
    _same(grads[0], grads[1])


def test_the_gradient_of_a_value_broadcast_twice_from_0d_keeps_its_shape(backend):
    """The backward adds two broadcasts of 0-d sums (``c + (c + a)`` over size-1 dims): both
    were dropped as scalar operands, and the region returned a 0-d gradient for
    ``[1, 1, 1]`` (found by the thorough random programs)."""
    grads = []
    for fn in (thunder.jit(lambda a, c: c + (c + a), executors=thunder_fuser.executors()), lambda a, c: c + (c + a)):
        a, c = torch.ones(1, 1, 1, 1, requires_grad=True), torch.ones(1, 1, 1, requires_grad=True)
        fn(a, c).sum().backward()
        grads.append((a.grad, c.grad))
    _same(grads[0], grads[1])


@pytest.mark.parametrize("case", [
    ("tanh of a contiguous input with odd size-1 strides, then a broadcast add",
     lambda a, c: torch.tanh(torch.tanh(c)) + a,
     lambda: (torch.randn(1, 2, 1, 1).expand(2, 2, 1, 1), torch.randn(1, 1, 1, 2).permute(3, 2, 1, 0))),
    ("a value of a permuted input at batch 1 with a reduction's result",
     lambda a: torch.tanh(a.amax(1)) + a * 4.0, lambda: (torch.randn(1, 1, 1, 2).permute(3, 2, 1, 0),)),
    ("a cat of channels-last values with size-1 dims",
     lambda a: torch.cat([a - a * 3, a], 0), lambda: (torch.randn(1, 5, 1, 5, dtype=torch.float64).permute(0, 3, 1, 2),)),
    ("an expanded bf16 plus a permuted fp32 (the CPU converts the bf16 by .to() first)",
     lambda c, a: torch.tanh(c + a),
     lambda: (torch.randn(1, 1, 1, 2).to(torch.bfloat16).expand(2, 1, 1, 2), torch.randn(2, 1, 1, 2).permute(3, 2, 1, 0))),
    ("a strided bf16 broadcast and times a permuted fp32 (converted as read, or on the CPU before the broadcast)",
     lambda c, a: torch.sigmoid(c * a).to(torch.bfloat16),
     lambda: (torch.randn(2, 1, 1, 2).to(torch.bfloat16)[..., ::2], torch.randn(1, 1, 3, 2).permute(3, 2, 1, 0))),
    ("a strided bf16 plus a permuted fp32 at batch 1",
     lambda c, a: torch.tanh(c + a),
     lambda: (torch.randn(2, 1, 1, 2).to(torch.bfloat16)[..., ::2], torch.randn(1, 2, 1, 2).permute(3, 2, 1, 0))),
    ("a value written over a permuted input, read before its next write (the first write elided)",
     lambda a, b: (b.copy_(a), torch.tanh(b), b.add_(a))[1],
     lambda: (torch.randn(1, 2).expand(2, 2), torch.randn(2, 2).to(torch.bfloat16).permute(1, 0))),
    ("a program's .to() of an expanded tensor: a dense copy",
     lambda c, a: c.expand(2, 3, 1, 1).to(torch.float32) * a,
     lambda: (torch.randn(2, 1, 1, 2).to(torch.bfloat16)[..., ::2], torch.randn(1, 1, 3, 2).permute(3, 2, 1, 0))),
], ids=lambda c: c[0])
def test_strides_as_tensoriterator_reads_size_1_dims(backend, case):
    """TensorIterator reads a size-1 dim's stride as it is, lays out an op of operands all
    contiguous (size-1 dims aside) contiguously unless a number is among them, and cat
    reads channels-last from strides; on the CPU an operand of another dtype than the op's
    is converted by ``.to()`` before the op and before its broadcast
    (``eager_decompositions.PROMOTING_OPS``), on CUDA as the kernel reads it, at its own
    strides; a program's ``.to()`` is a dense copy; a value whose write into a tensor is
    elided is read as that tensor (``Value.laid_out_as``): these outputs' strides differed from
    eager's (found by the thorough random programs and on the H200)."""
    _, f, make = case
    args = make()
    _, got = check_vs_eager(f, *args)
    want = f(*args)
    assert [s for s, n in zip(got.stride(), got.shape) if n != 1] == [s for s, n in zip(want.stride(), want.shape) if n != 1]


ACTIVATIONS = {
    "gelu": F.gelu, "gelu tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "softplus": F.softplus,
    "mish": F.mish, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid, "logsigmoid": F.logsigmoid, "selu": F.selu,
}


def _share_differing(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.dtype == want.dtype and got.shape == want.shape
    return (got.float() != want.float()).float().mean().item()


def _erf_gelu_once(x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
    """erf-gelu of ``x`` (with ``g``: its gradient) in fp32 torch ops, rounded once to ``x``'s
    dtype: what we compute, and what eager computes where its gelu kernel's erf is
    ``torch.erf``'s."""
    xf = x.float()
    cdf = 0.5 * (1.0 + torch.erf(xf * (1.0 / math.sqrt(2.0))))
    if g is None:
        return (xf * cdf).to(x.dtype)
    slope = cdf + xf * torch.exp(-0.5 * xf * xf) * (1.0 / math.sqrt(2.0 * math.pi))
    return (g.float() * slope).to(x.dtype)


def _as_eager(name: str, got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, g=None) -> None:
    """``got`` as eager's ``want`` but for a rare tie. torch's AVX512 CPU gelu kernels (forward
    and backward) take a vectorized erf of their own: on such a host 2.8% of bf16 results
    differ from ``torch.erf``'s (none on the GPU or on AVX2 hosts). There ``got`` may differ
    from eager as much as the once-rounded formula does, and must be that formula's."""
    gap = 0.0
    if name == "gelu" and x.device.type == "cpu":
        once = _erf_gelu_once(x, g)
        gap = _share_differing(once, want)
        assert _share_differing(got, once) < 0.01
    assert _share_differing(got, want) < 0.01 + gap


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_an_activation_of_16_bit_floats_rounds_once_as_eager(backend, name):
    """thunder decomposes these into torch-level ops that each round a bf16 intermediate;
    torch computes in fp32 and rounds once: bf16 gelu and silu differed from eager in 27-39%
    of elements (an ulp each). Now as eager's but for a rare tie. (bf16: the CPU's fp16
    kernels do not compute in fp32, its CUDA kernels and its bf16 ones do.)"""
    f = ACTIVATIONS[name]
    x = (torch.randn(1 << 12) * 3).to(torch.bfloat16)
    _as_eager(name, thunder.jit(f, executors=[fuser_ex])(x), f(x), x)


@pytest.mark.parametrize("name", ["gelu", "gelu tanh", "silu"])
def test_the_gradient_of_gelu_and_silu_of_16_bit_floats_rounds_once_as_eager(backend, name):
    """thunder's autodiff decomposes gelu and silu before a trace pass sees them, and its
    backward rounded half a bf16 gradient's elements an ulp from eager's: we claim them with
    torch's backward formulas, computed in fp32 and rounded once."""
    f = ACTIVATIONS[name]
    x = (torch.randn(1 << 12) * 3).to(torch.bfloat16)
    grads = []
    g = torch.linspace(-2, 2, x.numel(), dtype=x.dtype)
    for fn in (thunder.jit(f, executors=thunder_fuser.executors()), f):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        out.backward(g)
        grads.append((out.detach(), leaf.grad))
    _as_eager(name, grads[0][0], grads[1][0], x)
    _as_eager(name, grads[0][1], grads[1][1], x, g)


# programs of the pointwise template's variants (bias, ragged 1-D, cat/pad pieces along N and
# along an outer dim, a transposed operand, broadcasts along outer modes) for the 64-bit tests
INDEX64_PROGRAMS = {
    "soft-capping, ragged 1-D": (lambda x: torch.tanh(x / 30.0) * 30.0, lambda d: (torch.randn(4099, device=d),)),
    "bias": (lambda x, b: F.gelu(x + b), lambda d: (torch.randn(40, 24, device=d, dtype=torch.bfloat16),
                                                    torch.randn(24, device=d, dtype=torch.bfloat16))),
    "pad": (lambda x: F.pad(x, (0, 8)) * 2.0, lambda d: (torch.randn(40, 24, device=d),)),
    "cat along rows": (lambda x, y: torch.cat([x, y], 0) + 1.0, lambda d: (torch.randn(40, 24, device=d),
                                                                          torch.randn(8, 24, device=d))),
    "transposed operand": (lambda x, y: x + y.t(), lambda d: (torch.randn(64, 96, device=d), torch.randn(96, 64, device=d))),
    "broadcast along outer modes": (lambda x, y: x * y, lambda d: (torch.randn(6, 1, 64, device=d),
                                                                   torch.randn(1, 7, 64, device=d))),
}


def _segments_on_kernels(jfn) -> list:
    """(segment index, why it ran on torch) of every segment of the last call's forward
    regions that no kernel ran: [] where kernels ran them all."""
    from tests.helpers import plans

    return [(i, r) for p in plans(thunder.last_traces(jfn)[-1]) for i, r in p.decision.fallbacks.items()]


@pytest.mark.parametrize("name", INDEX64_PROGRAMS)
def test_past_32_bits_a_pointwise_kernel_indexes_in_64_bits(backend, monkeypatch, name):
    """Beyond 2**31 elements in one dim (a contiguous tensor is one) or in vectors, a
    pointwise kernel takes 64-bit extents and thread indices; below, 32-bit ones. The bound
    is lowered here to see it on the CPU (``test_tensors_past_2_31_elements_on_cuda`` runs
    the real sizes)."""
    from tests.helpers import planned_parts
    from thunder_fuser.backends.cute.tiling import geometry

    f, make = INDEX64_PROGRAMS[name]
    assert not any(p.geo.index64 for p in planned_parts(f, make("cpu")))
    monkeypatch.setattr(geometry, "INT32_LIMIT", 16)
    assert all(p.geo.index64 for p in planned_parts(f, make("cpu")))
    jfn, _ = check_vs_eager(f, *make("cpu"))
    if backend == "lowered":
        assert _segments_on_kernels(jfn) == []


@pytest.mark.parametrize("name", INDEX64_PROGRAMS)
def test_past_32_bits_a_pointwise_kernel_compiles_to_ptx(monkeypatch, name):
    from tests.helpers import compile_planned_kernels_to_ptx
    from thunder_fuser.backends.cute.tiling import geometry

    monkeypatch.setattr(geometry, "INT32_LIMIT", 16)
    f, make = INDEX64_PROGRAMS[name]
    compile_planned_kernels_to_ptx(f, make("cpu"))


@pytest.mark.parametrize("f, x", [
    (lambda x: x.float().sum(), torch.randn(9, 80, dtype=torch.bfloat16)),  # two dims, then a split
    (lambda x: x.sum(), torch.randn(9, 80, dtype=torch.bfloat16)),  # a 16-bit sum: fp32 partials
    (lambda x: x.float().sum(-1), torch.randn(9, 80, dtype=torch.bfloat16)),  # one long dim, split
    (lambda x: x.amax(), torch.randn(200)),
    (lambda x: torch.prod(x.float() * 0.01 + 1.0), torch.randn(4, 50)),
], ids=["sum of two dims", "bf16 sum", "one long dim", "amax", "prod"])
def test_past_32_bits_a_reduction_runs_on_row_kernels_in_stages(backend, monkeypatch, f, x):
    """A row or column kernel indexes a row's length in 32 bits: a reduction over more
    elements runs in stages of fewer (``ir/long_reductions.py``), innermost dims first, a dim
    too long viewed as ``[n / k, k]``; each stage on a kernel. The bound is lowered here
    (``test_tensors_past_2_31_elements_on_cuda`` runs the real sizes)."""
    from thunder_fuser.ir import long_reductions
    from thunder_fuser.backends.cute.tiling import geometry

    monkeypatch.setattr(geometry, "INT32_LIMIT", 64)
    monkeypatch.setattr(long_reductions, "INT32_LIMIT", 64)
    jfn, _ = check_vs_eager(f, x)
    if backend == "lowered":
        assert _segments_on_kernels(jfn) == []


def test_past_32_bits_what_no_stage_shortens_is_left_to_torch(backend, monkeypatch):
    """A dim of prime length cannot be viewed as shorter rows, and a row count past the bound
    is no reduced dim: torch runs them, and says why (rows of any length below the bound
    are fine: a row's offset is 64-bit)."""
    from thunder_fuser import explain
    from thunder_fuser.ir import long_reductions
    from thunder_fuser.backends.cute.tiling import geometry

    monkeypatch.setattr(geometry, "INT32_LIMIT", 64)
    monkeypatch.setattr(long_reductions, "INT32_LIMIT", 64)
    for f, x in ((lambda x: x.sum(-1), torch.randn(9, 83)), (lambda x: x.float().sum(-1), torch.randn(80, 3))):
        jfn, _ = check_vs_eager(f, x)
        if backend == "lowered":
            assert "the row and column kernels index their extents in 32 bits" in explain(jfn)
    jfn, _ = check_vs_eager(lambda x: x.float().sum(-1), torch.randn(60, 12, dtype=torch.bfloat16))  # 720 elements
    if backend == "lowered":
        assert _segments_on_kernels(jfn) == []


def _big(n: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(n, dtype=dtype, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("case", [
    ("pointwise (Gemma-2's soft-capping)", lambda x: torch.tanh(x / 30.0) * 30.0, lambda: (_big(2**31 + 4096),)),
    ("pointwise, ragged", lambda x: x * 2.0 + 1.0, lambda: (_big(2**31 + 7),)),
    ("row reduction", lambda x: x.float().sum(-1), lambda: (_big(2**31 + 2048).view(-1, 2048),)),
    ("resize (a pad)", lambda x: F.pad(x, (0, 8)) * 2.0, lambda: (_big(2**31 + 2048).view(-1, 2048),)),
    ("resize (a cat along a dim of 2**31)", lambda x: torch.cat([x, x[:8]]) * 2.0, lambda: (_big(2**31 + 8),)),
    ("softmax rows", lambda x: torch.softmax(x, -1), lambda: (_big(2**31 + 4096).view(-1, 4096),)),
    ("whole-tensor sum of one dim (in stages)", lambda x: x.float().sum(), lambda: (_big(2**31 + 2048),)),
    ("mean of two dims (in stages)", lambda x: (x.float() ** 2).mean(), lambda: (_big(2**31 + 2048).view(-1, 2048),)),
], ids=lambda c: c[0])
def test_tensors_past_2_31_elements_on_cuda(case):
    """Every one runs on kernels: pointwise and resize in 64-bit indices, rows in 32-bit
    extents with 64-bit offsets, a reduction over more elements in stages of fewer."""
    _, f, make = case
    (x,) = make()
    jfn = thunder.jit(f, executors=[fuser_ex])
    got = jfn(x)
    assert _segments_on_kernels(jfn) == []
    want = f(x)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    del got, want
    torch.cuda.empty_cache()


@pytest.mark.cuda
@pytest.mark.parametrize("name", BOOL_STORES)
def test_a_bool_a_kernel_writes_is_torchs_bool_on_cuda(name):
    """Its byte is 1 for true, so torch counts it right and a kernel that reads it (a row's
    scalar, converted to fp32: a loss's mask, as FSDP's regions pass it) reads 1.0, not -1.0."""
    f, make = BOOL_STORES[name]
    args = [a.cuda() for a in make()]
    got, want = thunder.jit(f, executors=[fuser_ex])(*args), f(*args)
    for g, w in zip(*((o,) if isinstance(o, torch.Tensor) else o for o in (got, want))):
        if g.dtype == torch.bool:
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
            mask = g.reshape(g.shape[0], -1)[:, :1]
            rows = torch.randn(mask.shape[0], 64, device="cuda")
            masked = thunder.jit(lambda x, m: torch.log_softmax(x, 1) * m.float(), executors=[fuser_ex])
            torch.testing.assert_close(masked(rows, mask), torch.log_softmax(rows, 1) * w.reshape(w.shape[0], -1)[:, :1].float())


@pytest.mark.cuda
@pytest.mark.parametrize("name", INDEX64_PROGRAMS)
def test_64_bit_pointwise_kernels_on_cuda(monkeypatch, name):
    """The 64-bit variant of each pointwise template on small tensors (the bound lowered),
    every fresh output starting as NaN so that an unwritten element fails."""
    from thunder_fuser.backends.cute.tiling import geometry
    from thunder_fuser.backends.cute import segment_kernel

    monkeypatch.setattr(geometry, "INT32_LIMIT", 16)
    monkeypatch.setattr(segment_kernel, "FILL_NAN", True)
    f, make = INDEX64_PROGRAMS[name]
    jfn, _ = check_vs_eager(f, *make("cuda"))
    assert _segments_on_kernels(jfn) == []


@pytest.mark.parametrize("f", [
    lambda b: b * b.sum(), lambda b: torch.add(b, b.sum(), alpha=-1.5), lambda b: b / (b.amax().abs() + 1),
    lambda b: torch.tanh(b) / (b.mean() + 3.0),
], ids=["times its sum", "add alpha", "over its max", "over its mean"])
def test_the_gradient_of_a_computed_0d_tensor_broadcast_elementwise_is_summed(backend, f):
    """thunder 0.2.6's grad rules handed the 0-d operand an unsummed gradient (silently wrong
    with its own executors too): ``patches/scalar_tensor_grads.py``."""
    grads = []
    for fn in (thunder.jit(f, executors=thunder_fuser.executors()), f):
        b = torch.linspace(-1.0, 2.0, 15, dtype=torch.float64).reshape(5, 3).requires_grad_()
        fn(b).sum().backward()
        grads.append(b.grad)
    _same(grads[0], grads[1])


def test_a_0d_input_broadcast_against_a_tensor_gets_its_gradient_summed(backend):
    def f(a, b):
        return torch.tanh(a) / (b.abs() + 1)

    grads = []
    for fn in (thunder.jit(f, executors=thunder_fuser.executors()), f):
        a, b = torch.ones(1, 1, 2, requires_grad=True), torch.tensor(0.5, requires_grad=True)
        fn(a, b).sum().backward()
        grads.append((a.grad, b.grad))
    _same(grads[0], grads[1])


@pytest.mark.parametrize("f", [torch.relu, lambda a: a.clamp(-1, 1), lambda a: torch.maximum(a, a * 0.5) + 1.0],
                         ids=["relu", "clamp", "maximum"])
def test_fp64_values_beside_python_numbers_compile_to_ptx(f):
    """Found on the H200 by the random programs: the DSL took a Python float beside fp64
    values as fp32 and refused the pair (the segment fell back with a KernelBugWarning)."""
    from tests.helpers import compile_planned_kernels_to_ptx

    compile_planned_kernels_to_ptx(f, (torch.randn(64, dtype=torch.float64),))


def test_a_0d_tensor_written_and_read_beside_a_tensor_is_read_after_its_write_lands(backend):
    """``b.sub_(...)`` of a 0-d ``b`` then ``a.mul_(b)``: one kernel wrote ``b`` (every thread
    the same element) and computed ``a * b`` again from ``b``'s memory, after the write: inf
    came out -inf in the lowered programs, and on CUDA threads would race (found by the CPU
    hunt of the lowered programs). A read of a written 0-d value beside a tensor now waits
    for the write's kernel."""
    def f(a, b):
        t0 = b.to(torch.bfloat16)
        b.sub_(t0, alpha=0.5)
        a.mul_(b)
        return (b.clamp(-1, 1),)

    for n in (1, 5):
        check_vs_eager(f, torch.full((n,), float("inf"), dtype=torch.float64), torch.tensor(0.4, dtype=torch.float64))


def test_an_op_over_a_cat_reshaped_through_its_cat_dim_is_not_computed_with(backend):
    """A mean over a dim of two (rewritten as two slices added) of ``minimum(cat(...), a)``,
    each slice reshaped so that the cat dim goes: the reshape pushed through the ``minimum``
    turned its cat operand into a value that can only be stored, and the lowered programs
    computed with it (``TypeError: Reshaped`` in ``backends/cute/torch_eval.py``; found by the CPU
    hunt of the lowered programs). Such an op is now itself stored through the reshape, and a
    segment that computes with it runs on the reference backend, saying why."""
    def f(a):
        t0 = torch.cat([a, a * 2], 1)
        t1 = torch.minimum(t0, a)
        t2 = t1.mean(-4)
        torch.cat([t2, t2 * 2], 0)
        return t1.mean(-3), t2

    check_vs_eager(f, torch.randn(2, 1, 5, 1, dtype=torch.float16))


def test_a_later_launch_of_a_segment_never_reads_what_an_earlier_one_wrote_in_place(backend):
    """``a.add_(a)`` and a column sum beside it, read after the sum: the segment runs as a
    reduction, then a pointwise launch that computed ``a + a`` again from ``a``'s memory,
    which the first launch had already written (``4a`` for ``2a``; found by the thorough
    property of the lowered programs). Such a segment now runs on the reference backend."""
    def f(a, b):
        a.add_(a)
        t = torch.tanh(torch.tanh(b).sum(0, keepdim=True))
        return (t + a,)

    check_vs_eager(f, torch.randn(2, 1, 1, 2), torch.randn(2, 1, 1, 2))
