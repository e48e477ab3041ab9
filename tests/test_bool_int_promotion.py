"""A bool tensor with a Python int, through thunder + fuser, as torch promotes it: int64
(``patches/bool_int_promotion.py``). thunder's lattice gave int8, so our kernels wrapped
``(x > 0) * 200`` to -56, and a float op after it returned the wrapped values."""

from __future__ import annotations

import operator

import thunder
import torch
from hypothesis import given, settings, strategies as st

import thunder_fuser

OPS = {"mul": operator.mul, "add": operator.add, "rmul": lambda a, n: n * a}  # torch refuses a bool's subtraction


@settings(max_examples=10, deadline=None)
@given(op=st.sampled_from(list(OPS)), n=st.integers(-(2**40), 2**40), then_float=st.booleans(),
       zero_dim=st.booleans(), seed=st.integers(0, 2**16))
def test_a_bool_tensor_with_an_int_is_int64_as_in_torch(op, n, then_float, zero_dim, seed):
    def f(x):
        mask = (x.sum() if zero_dim else x) > 0
        out = OPS[op](mask, n)
        return out * x if then_float else out + torch.ones(4, dtype=torch.int32)

    x = torch.randn(4, generator=torch.Generator().manual_seed(seed))
    before = x.clone()
    got, want = thunder.jit(f, executors=thunder_fuser.executors())(x), f(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    assert torch.equal(x, before)
