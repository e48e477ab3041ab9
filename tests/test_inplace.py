"""In-place updates: copy_to_out_ rewriting, alias safety, and eager-equivalent errors."""

import pytest
import thunder
import torch

from benchmarks.workloads import adam_step
from helpers import check_vs_eager, fusion_names
from thunder_fuser import fuser_ex
from thunder_fuser.functionalize import AliasError


def test_add_inplace_then_mul_is_one_region_with_copy_to_out():
    def f(a, b):
        a.add_(b)
        return a * 2

    jfn, _ = check_vs_eager(f, torch.randn(4, 4), torch.randn(4, 4))
    text = str(thunder.last_traces(jfn)[-1])
    assert fusion_names(jfn) == ["fuser0"]
    assert (
        "  (t4, t2) = fuser0(a, b)\n"
        "    # segment 0 [pointwise]  (a, b) -> (t4, t2)\n"
        "    #   t0 = prims.add(a, b)\n"
        "    #   t4 = copy_to_out_(t0, out=a)\n"
        "    #   t2 = prims.mul(t4, 2.0)\n"
    ) in text


def test_kv_cache_program_from_the_copy_to_out_pr():
    def f(q, k, v, mask, idx, src):
        q.index_copy_(2, idx, src)
        k.index_copy_(2, idx, src)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, mask)

    q = torch.randn(1, 4, 2, 16)
    k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 4, 3, 16)
    mask = torch.ones(1, 1, 2, 3, dtype=torch.bool)
    check_vs_eager(f, q, k, v, mask, torch.arange(2), torch.randn(1, 4, 2, 16))


def test_adamw_step_writes_params_and_state_through_copy_to_out():
    shapes = [(64,), (8, 16), (3, 5, 7)]
    args = [[torch.randn(s) for s in shapes] for _ in range(4)]
    args[3] = [a.abs() for a in args[3]]
    jfn, _ = check_vs_eager(adam_step, *args)
    trace = thunder.last_traces(jfn)[-1]
    text = str(trace)
    # six in-place ops per parameter (p: mul_, addcdiv_; m: lerp_; v: mul_, addcmul_;
    # denom: add_ on a temporary) store each of p, m and v exactly once
    assert text.count("copy_to_out_(") == 3 * len(shapes)
    assert "= copy_(" not in text
    for b in trace.bound_symbols:
        if b.sym.name.startswith("fuser"):
            runner = b._call_ctx[b.sym.name]
            # one pointwise kernel per parameter shape: reads, math and every write together
            assert [s.kind for s in runner.segments] == ["pointwise"] * len(shapes)


def test_write_into_a_view_of_an_input():
    def f(x, y):
        x[:, 1:3].mul_(y)
        x.t()[0].add_(1)
        return x.sum(0)

    check_vs_eager(f, torch.randn(4, 5), torch.randn(4, 2))


def test_same_tensor_twice():
    def f(a, b):
        a.add_(b)
        return a + b

    x = torch.randn(3, 3)
    jfn = thunder.jit(f, executors=[fuser_ex])
    y = x.clone()
    torch.testing.assert_close(jfn(x, x), f(y, y))
    torch.testing.assert_close(x, y)


def test_inplace_on_expanded_input_raises_like_eager_before_writing():
    def f(a, b):
        b.add_(1)
        a.add_(1)
        return a

    jfn = thunder.jit(f, executors=[fuser_ex])
    a = torch.randn(3).expand(4, 3)
    b = torch.zeros(2)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        f(torch.randn(3).expand(4, 3), torch.zeros(2))
    before_a, before_b = a.clone(), b.clone()
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        jfn(a, b)
    torch.testing.assert_close(b, before_b)
    torch.testing.assert_close(a, before_a)


def test_inplace_on_leaf_requiring_grad_raises():
    def f(a):
        a.mul_(2)
        return a

    a = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(a)
    jfn = thunder.jit(f, executors=[fuser_ex])
    before = a.detach().clone()
    with pytest.raises(Exception, match="leaf|requires grad|in-place"):
        jfn(a)
    torch.testing.assert_close(a.detach(), before)


def test_fill_is_traced_like_zero():
    # thunder 0.2.6 has no Tensor.fill_; thunder_fuser registers it (patches/missing_torch_ops.py)
    def f(x, y):
        x[1:3].fill_(2.5)
        return x * y

    check_vs_eager(f, torch.randn(4, 4), torch.randn(4, 4))
    check_vs_eager(f, torch.randn(4, 4), torch.randn(4, 4), executors=["torch"])


def _views_of_one_base(x, y):
    x.mul_(2.0)
    return x + 1, y * 1


@pytest.mark.xfail(strict=True, reason=(
    "thunder 0.2.6 treats arguments sharing a storage as one tensor ('[alias tensor args] `y` "
    "is replaced by `x`'), so two different views of one base give wrong results with every "
    "executor, its own torch executor included"
))
def test_thunder_treats_two_views_of_one_base_as_one_tensor():
    base = torch.randn(6, 6)
    expected_base = base.clone()
    expected = _views_of_one_base(expected_base[:, :3], expected_base[:, 3:])
    got = thunder.jit(_views_of_one_base, executors=["torch"])(base[:, :3], base[:, 3:])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(base, expected_base)


def test_two_views_of_one_base_are_refused_before_anything_is_written():
    """Where thunder took inputs sharing storage for one tensor, fuser_ex's trace checks
    first (``passes/input_aliases.py``): different views raise, naming both, and write nothing."""
    base = torch.randn(6, 6)
    before = base.clone()
    jfn = thunder.jit(_views_of_one_base, executors=[fuser_ex])
    with pytest.raises(AliasError, match="'x' and 'y' share storage as different views"):
        jfn(base[:, :3], base[:, 3:])
    assert torch.equal(base, before)
    a = torch.randn(3, 3)  # one view twice is what thunder assumes: it runs
    want_a = a.clone()
    torch.testing.assert_close(jfn(a, a), _views_of_one_base(want_a, want_a))
    torch.testing.assert_close(a, want_a)


def test_fill_called_as_a_function():
    def f(x):
        torch.Tensor.fill_(x, 3.0)
        return x + 1

    check_vs_eager(f, torch.randn(3))
