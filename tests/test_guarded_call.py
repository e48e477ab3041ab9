"""``GuardedCall``: a jitted function's recorded computation called past thunder's lookup,
only where thunder's lookup would pick the same entry. Each case compares with eager on
fresh inputs, in-place writes included, and says whether the call went past thunder."""

import pytest
import thunder
import torch
from hypothesis import given, settings, strategies as st

import thunder_fuser
from thunder_fuser.functionalize.functionalize import AliasError
from thunder_fuser.runtime.guarded_call import GuardedCall


def _update(xs, ys, scale, alpha=1.0):
    """In place, as an optimizer's update: ``x += alpha * scale * y`` for each pair."""
    for x, y in zip(xs, ys):
        x.add_(y * scale, alpha=alpha)


def _eager(xs, ys, scale, alpha=1.0):
    with torch.no_grad():
        _update(xs, ys, scale, alpha)


def _fresh(shapes, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    ys = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    return xs, ys, torch.tensor(0.5, dtype=dtype)


def _check(call, xs, ys, scale, alpha=1.0) -> bool:
    """One call on ``xs`` (written in place) against eager on copies; whether it went past thunder."""
    want = [x.clone() for x in xs]
    ys_eager = [y.clone() if isinstance(y, torch.Tensor) else y for y in ys]
    _eager(want, ys_eager, scale, alpha)
    written = {x.untyped_storage().data_ptr() for x in xs}
    read_only = [(y, y.clone()) for y in ys if isinstance(y, torch.Tensor) and y.untyped_storage().data_ptr() not in written]
    before = call.direct_calls
    with torch.no_grad():
        call(xs, ys, scale, alpha=alpha)
    for x, w in zip(xs, want):
        torch.testing.assert_close(x, w)
    for y, b in read_only:  # the inputs it only reads are left alone
        torch.testing.assert_close(y, b)
    return call.direct_calls > before


@pytest.fixture
def call(torch_kernels):
    return GuardedCall(thunder.jit(_update, executors=thunder_fuser.executors()))


SHAPES = [(4, 8), (16,), (3, 5)]


def test_a_second_call_on_fresh_tensors_of_the_same_metadata_goes_past_thunder_and_matches_eager(call):
    assert not _check(call, *_fresh(SHAPES, 0))
    for seed in (1, 2, 3):
        assert _check(call, *_fresh(SHAPES, seed))
    assert call.direct_calls == 3


@pytest.mark.parametrize("change", ["shape", "dtype", "strides", "length", "constant", "requires_grad", "number",
                                    "autocast"])
def test_anything_thunders_lookup_reads_that_differs_goes_through_thunder(call, change):
    assert not _check(call, *_fresh(SHAPES, 0))
    assert _check(call, *_fresh(SHAPES, 1))
    xs, ys, scale = _fresh(SHAPES, 2)
    alpha = 1.0
    if change == "shape":
        xs, ys, scale = _fresh([(4, 9), (16,), (3, 5)], 2)
    elif change == "dtype":
        xs, ys, scale = _fresh(SHAPES, 2, torch.float64)
    elif change == "strides":
        xs[0] = xs[0].t().contiguous().t()
    elif change == "length":
        xs, ys, scale = _fresh(SHAPES + [(2,)], 2)
    elif change == "constant":
        alpha = 2.0
    elif change == "requires_grad":
        ys[1].requires_grad_(True)
    elif change == "number":  # a list of the same length holding a number: the guard fails on it
        ys[1] = 2.0
    if change == "autocast":  # thunder's cache info then holds autocast's dtype, which GuardedCall leaves to it
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not _check(call, xs, ys, scale, alpha)
    else:
        assert not _check(call, xs, ys, scale, alpha)
    assert _check(call, *_fresh(SHAPES, 3))  # and the recorded entry still serves


def test_tensors_that_share_storage_go_through_thunder_which_orders_the_writes(call):
    """A read of one list aliasing a write of the other: thunder's alias key picks a trace
    for that sharing; the recorded one (made for distinct storages) must not run."""
    assert not _check(call, *_fresh(SHAPES, 0))
    xs, ys, scale = _fresh(SHAPES, 1)
    ys[0] = xs[0]  # x0 += 0.5 * x0
    assert not _check(call, xs, ys, scale)
    base = torch.randn(2 * 16)
    xs, ys, scale = _fresh(SHAPES, 2)
    xs[1], ys[1] = base[:16], base[16:]  # one storage, apart: thunder's call, our executor's clear refusal
    with pytest.raises(AliasError, match="share storage"), torch.no_grad():
        call(xs, ys, scale)
    assert _check(call, *_fresh(SHAPES, 3))


def test_a_call_with_a_sparse_tensor_is_thunders_and_never_recorded():
    """A sparse tensor has no storage or strides to guard: the call is thunder's, its result
    eager's (recording it raised ``Cannot access storage of SparseTensorImpl`` after thunder's
    call had run)."""
    def scale(xs, y):
        for x in xs:
            x.mul_(2.0)
        return y.to_dense() * 2

    call = GuardedCall(thunder.jit(scale))
    xs, y = [torch.ones(3)], torch.eye(3).to_sparse()
    out = call(xs, y)
    assert torch.equal(out, 2 * torch.eye(3)) and torch.equal(xs[0], torch.full((3,), 2.0))
    assert not call.recorded and call.direct_calls == 0


def test_a_plain_callable_is_called_as_it_is():
    seen = []
    call = GuardedCall(lambda *a, **k: seen.append((a, k)) or "out")
    assert call([torch.ones(2)], 3, k=1) == "out" and call.direct_calls == 0 and len(seen) == 1


_SHARED: dict = {}


@settings(deadline=None, max_examples=10)
@given(st.lists(st.sampled_from(["same", "fresh", "shape", "alias", "strides"]), min_size=1, max_size=6),
       st.integers(0, 2**16))
def test_any_sequence_of_calls_matches_eager(kinds, seed):
    """Whatever the order of fresh, reshaped, aliased and restrided calls: eager's results
    (one jitted function for every example: each kind traces once)."""
    import os

    os.environ["THUNDER_FUSER_KERNELS"] = "torch"
    try:
        call = _SHARED.setdefault("call", GuardedCall(thunder.jit(_update, executors=thunder_fuser.executors())))
        kept = _fresh(SHAPES, seed)
        for i, kind in enumerate(kinds):
            xs, ys, scale = kept if kind == "same" else _fresh(SHAPES if kind != "shape" else [(2, 2), (16,), (3, 5)], seed + i + 1)
            if kind == "alias":
                ys[2] = xs[2]
            if kind == "strides":
                ys[0] = ys[0].t().contiguous().t()
            _check(call, xs, ys, scale)
    finally:
        del os.environ["THUNDER_FUSER_KERNELS"]


@pytest.mark.cuda
def test_on_the_gpu_direct_calls_match_eager_on_fresh_and_repeated_tensors():
    """CuTe kernels and their region graphs under the direct call: tensors at new addresses
    each call, the same tensors again, then the same metadata on the CPU (thunder's call)."""
    call = GuardedCall(thunder.jit(_update, executors=thunder_fuser.executors()))

    def on_gpu(xs, ys, scale):
        return [x.cuda() for x in xs], [y.cuda() for y in ys], scale.cuda()

    kept = on_gpu(*_fresh(SHAPES, 0))
    assert not _check(call, *kept)
    for seed in range(1, 7):
        assert _check(call, *(kept if seed % 2 else on_gpu(*_fresh(SHAPES, seed))))
    torch.cuda.synchronize()
    assert not _check(call, *_fresh(SHAPES, 9))  # another device: thunder's lookup


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 3e38, -0.0])
def test_a_direct_call_on_nan_inf_huge_and_0d_values_is_eagers(call, value):
    """The direct call computes what thunder's would, whatever the values: NaN, infinities,
    values whose product overflows, a negative zero; a 0-d tensor among the list's."""
    shapes = [(4, 8), (), (3,)]
    assert not _check(call, *_fresh(shapes, 0))
    xs, ys, scale = _fresh(shapes, 1)
    for y in ys:
        y.fill_(value)
    want = [x.clone() for x in xs]
    _eager(want, [y.clone() for y in ys], scale)
    before = call.direct_calls
    with torch.no_grad():
        call(xs, ys, scale, alpha=1.0)  # as the first call (``_check``'s): the same keyword constants
    assert call.direct_calls == before + 1
    for x, w in zip(xs, want):
        torch.testing.assert_close(x, w, equal_nan=True)
