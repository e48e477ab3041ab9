"""Outputs a matmul reads are laid out for it (``layout/matmul_operands.py``), and views a
matmul would copy are stored by the kernel (``plan/stored_views.py``): the GPT block's
attention without its ten copies a step, and never at the cost of aliasing anyone can see."""

import itertools

import pytest
import thunder
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from thunder_fuser import explain, fuser_ex
from thunder_fuser.layout import matmul_copies, matmul_order, strides_for_order
from thunder_fuser.layout.matmul_operands import BATCHED, FOLDED

B, S, H, E = 2, 16, 4, 8


class _Clones(TorchDispatchMode):
    """Counts the copies torch makes (``reshape`` of unmergeable dims clones)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.clone.default:
            self.shapes.append((tuple(args[0].shape), args[0].stride()))
        return func(*args, **(kwargs or {}))


@given(
    shape=st.lists(st.integers(1, 5), min_size=3, max_size=5),
    perm_seed=st.randoms(use_true_random=False),
    how=st.sampled_from([BATCHED, FOLDED]),
)
def test_a_matmul_order_is_read_without_a_copy_and_keeps_a_matrix_dim_innermost(shape, perm_seed, how):
    order = list(range(len(shape)))
    perm_seed.shuffle(order)
    order = tuple(order)
    new = matmul_order(order, how)
    assert sorted(new) == sorted(order)
    assert not matmul_copies(shape, strides_for_order(shape, new), how)
    if how == BATCHED and order[-1] >= len(shape) - 2:
        assert new[-1] == order[-1]  # the kernel's vector dim stays where it was


@pytest.mark.parametrize("how", [BATCHED, FOLDED])
def test_matmul_copies_agrees_with_what_torch_matmul_copies(how):
    """Every layout of a 4-d operand whose innermost dim is a matrix dim (where the CPU's and
    cuBLAS's bmm agree): torch.matmul clones exactly where matmul_copies says it copies."""
    shape = (2, 3, 4, 5)
    other = torch.randn(2, 3, 5, 6) if how == BATCHED else torch.randn(5, 6)
    checked = 0
    for order in itertools.permutations(range(4)):
        if order[-1] < 2:
            continue
        t = torch.randn(shape).permute(*order).contiguous().permute(*[order.index(d) for d in range(4)])
        assert t.stride() == strides_for_order(shape, order)
        with _Clones() as c:
            torch.matmul(t, other)
        assert bool(c.shapes) == matmul_copies(shape, t.stride(), how), (order, c.shapes)
        checked += 1
    assert checked == 12


def _split(qkv):
    b, s, _ = qkv.shape
    return (t.view(b, s, H, E).transpose(1, 2) for t in qkv.split(H * E, dim=-1))


def _attention(qkv):
    """The GPT block's attention without SDPA: q and k scaled (a kernel), v a view."""
    q, k, v = _split(qkv)
    p = torch.softmax((q * 0.5) @ (k.transpose(-2, -1) * 0.5), dim=-1)
    return p @ v


def _attention_returning_v(qkv):
    q, k, v = _split(qkv)
    p = torch.softmax((q * 0.5) @ (k.transpose(-2, -1) * 0.5), dim=-1)
    return p @ v, v


def _attention_after_an_in_place_write(qkv):
    qkv = qkv * 1
    qkv.mul_(2)
    return _attention(qkv)


def test_the_attention_matmuls_read_every_operand_without_a_copy(torch_kernels):
    jfn = thunder.jit(_attention, executors=[fuser_ex])
    for _ in range(2):  # the first call plans, the second runs the straight-line code
        qkv = torch.randn(B, S, 3 * H * E)
        want = _attention(qkv)
        with _Clones() as c:
            got = jfn(qkv)
        torch.testing.assert_close(got, want)
        assert c.shapes == []
    with _Clones() as c:
        _attention(qkv)
    assert len(c.shapes) == 3  # eager copies q, k^T and v
    report = explain(jfn)
    assert "a batched matmul reads it" in report
    assert "stores view output" in report  # v
    # q in [b, h, s, e] from the projection's [b, s, h*e]: the split fastest dim's inner part
    # stays innermost, so no transpose template
    assert "runs as transpose" not in report


def test_layouts_for_matmuls_on_the_reference_backend_too():
    jfn = thunder.jit(_attention, executors=[fuser_ex])
    qkv = torch.randn(B, S, 3 * H * E)
    torch.testing.assert_close(jfn(qkv), _attention(qkv))
    assert "not (0, 2, 1, 3): a batched matmul reads it" in explain(jfn)


@pytest.mark.parametrize("fn", [_attention_returning_v, _attention_after_an_in_place_write])
def test_a_view_stays_a_view_where_its_aliasing_could_be_seen(torch_kernels, fn):
    """A returned view, or any view in a trace that writes in place, is never stored as a copy."""
    jfn = thunder.jit(fn, executors=[fuser_ex])
    qkv = torch.randn(B, S, 3 * H * E)
    got, want = jfn(qkv.clone()), fn(qkv.clone())
    torch.testing.assert_close(got, want)
    assert "stores view output" not in explain(jfn)
    if fn is _attention_returning_v:
        q = qkv.clone()
        assert jfn(q)[1].untyped_storage().data_ptr() == q.untyped_storage().data_ptr()


@pytest.mark.cuda
def test_the_attention_matmuls_read_every_operand_without_a_copy_on_kernels():
    """On CuTe DSL kernels, bf16, a ragged sequence: the same, with no segment falling back."""
    import warnings

    from thunder_fuser.backends.cute.backend import KernelFallbackWarning

    jfn = thunder.jit(_attention, executors=[fuser_ex])
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        for _ in range(2):
            qkv = torch.randn(B, 17, 3 * H * E, device="cuda", dtype=torch.bfloat16)
            with _Clones() as c:
                got = jfn(qkv)
            torch.testing.assert_close(got, _attention(qkv), atol=2e-2, rtol=2e-2)
            assert c.shapes == []
    assert "stores view output" in explain(jfn)
