"""A ``Tensor.__setitem__`` written in place, as the program wrote it (``passes/writes_in_place.py``),
and a chain of number writes into one tensor made one fill (``passes/constant_writes.py``): a
mask built row by row in a loop costs one launch, never a copy of the whole mask per row;
values and gradients are eager's, later writes win where writes overlap, and a read between
two writes sees the first."""

import pytest
import thunder
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import thunder_fuser


def _jit(fn):
    return thunder.jit(fn, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())


def _sliding_window_scores(scores, window: int):
    """litgpt's Gemma-2 sliding-window mask, as litgpt builds it: a row per step of a loop."""
    t = scores.shape[-1]
    mask = torch.full((t, t), float("-inf"), dtype=scores.dtype)
    for i in range(t):
        mask[i, max(0, i - window + 1): i + 1] = 0.0
    return torch.softmax(scores + mask, dim=-1)


def test_a_mask_built_row_by_row_is_one_fill():
    jfn = _jit(_sliding_window_scores)
    for _ in range(2):
        scores = torch.randn(2, 16, 16, requires_grad=True)
        want = _sliding_window_scores(scores, 4)
        got = jfn(scores, 4)
        torch.testing.assert_close(got, want)
        g = torch.randn_like(want)
        torch.testing.assert_close(torch.autograd.grad(got, scores, g), torch.autograd.grad(want, scores, g))
    trace = str(thunder.last_traces(jfn)[-1])
    assert trace.count("fuser_fill_at_(") == 1, trace
    assert "copy_with_setitem" not in trace and "fuser_setitem_" not in trace, trace


def _read_between(x, v):
    m = x.clone()
    old = m * 2  # a read of the old value, before the write
    m[1:3] = v
    return m + old


def _shifted_into_itself(x):
    m = x.clone()
    m[1:] = m[:-1]
    return m


def test_a_read_of_the_old_value_before_the_write_reads_the_old_value():
    jfn = _jit(_read_between)
    x, v = torch.randn(5, 3), torch.randn(3)
    torch.testing.assert_close(jfn(x, v), _read_between(x, v))


def test_a_value_that_overlaps_the_base_is_refused_as_eager_refuses_it():
    """Written in place, the write meets torch's own overlap check, as eager's does (thunder's
    functional form would have answered where eager raises)."""
    x = torch.randn(6, 2)
    with pytest.raises(RuntimeError, match="refer to a single memory location") as eager:
        _shifted_into_itself(x)
    with pytest.raises(RuntimeError, match="refer to a single memory location") as ours:
        _jit(_shifted_into_itself)(x)
    assert str(ours.value) == str(eager.value)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 6), start=st.integers(-6, 6), stop=st.integers(-6, 6), step=st.integers(1, 3),
       col=st.integers(-3, 2), tensor_value=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_setitem_of_slices_and_indices_matches_eager(rows, start, stop, step, col, tensor_value, dtype):
    """Any slice of rows and one column (or all) written with a number or a tensor, then read:
    the values eager gives, and the input never written."""

    def fn(x, v):
        m = x.clone()
        m[start:stop:step, col] = v
        return m * 1.5

    x = torch.randn(rows, 3, dtype=dtype)
    v = torch.randn((), dtype=dtype) if tensor_value else 0.25
    before = x.clone()
    torch.testing.assert_close(_jit(fn)(x, v), fn(x, v))
    assert torch.equal(x, before)


_KEYS = st.tuples(st.integers(-4, 3), st.integers(-5, 5), st.integers(-5, 5), st.integers(1, 2))


@settings(max_examples=12, deadline=None)
@given(writes=st.lists(st.tuples(_KEYS, st.sampled_from([0.0, -1.5, float("-inf"), 7, float("nan")])), min_size=1,
                       max_size=12),
       read_after=st.integers(0, 12), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int32]))
def test_writes_of_numbers_one_after_another_match_eager(writes, read_after, dtype):
    """Number writes into rows and column ranges of one tensor, overlapping, in any order, a
    read of the tensor somewhere between them: eager's values (a later write wins), whether
    the writes are merged into a fill (floating point) or stay writes (integers)."""
    if dtype == torch.int32:
        writes = [(k, 3 if v != v or v in (float("inf"), float("-inf")) else int(v)) for k, v in writes]

    def fn(x):
        m = x.clone()
        seen = m * 1
        for n, ((row, start, stop, step), value) in enumerate(writes):
            if n == read_after:
                seen = m * 2
            m[row, start:stop:step] = value
        return m, seen

    x = (torch.randn(4, 5) * 4).to(dtype)
    before = x.clone()
    for got, want in zip(_jit(fn)(x), fn(x)):
        torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.equal(x, before)
