"""Property: random programs (``attack_programs.py``) give eager's answer: the same values
(NaN where eager has NaN), dtypes and shapes, strides where eager's outputs are fresh
tensors, the same contents of every input they write, and, for programs that write
nothing, the same gradients. On the CPU on the reference backend and on the lowered kernel
programs (what CUDA runs); on a GPU on kernels. CI's profile draws the same 100 examples
every run (a failure found at random belongs to whoever hunts, not to the next commit's
CI); ``HYPOTHESIS_PROFILE=thorough`` draws 5,000 of each at random, and
``scripts/hunt_random_programs.py`` as many as asked."""

from __future__ import annotations

import re

import pytest
import thunder
import torch
from hypothesis import assume, given, settings

from attack_programs import AttackProgram, attack_programs
from helpers import clone_args, kernel_examples
from thunder_fuser import fuser_ex

# eager warns of var over a dim of extent 1, and of a mean of nothing
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


THOROUGH = settings.default.max_examples >= 5000


def _examples(ci: int) -> int:
    """``ci`` examples in CI's profile (each jits a program two or three times); the
    profile's own count in the thorough one (5,000)."""
    profile = settings.default.max_examples
    return profile if THOROUGH else min(ci, profile)


def _tolerance(dtypes: set, ops: int) -> dict:
    """Eager rounds every op of a 16-bit program to 16 bits, a fusion once: their distance
    grows with the ops between."""
    if torch.float16 in dtypes or torch.bfloat16 in dtypes:
        eps = 2**-7 if torch.bfloat16 in dtypes else 2**-10
        return dict(atol=4 * eps * ops, rtol=4 * eps * ops)
    return dict(atol=1e-5 * ops, rtol=1e-5 * ops)


def _cast_to(lines: list[str]) -> set:
    """The 16-bit dtypes a program casts to on its way: a value rounded to bf16 in the middle
    (``a.sub_(F.gelu(a.to(torch.bfloat16)))`` over fp64 ``a``) carries bf16's rounding into
    an fp64 result, where eager's and a kernel's bf16 math may differ by an ulp."""
    text = "\n".join(lines)
    return {dt for dt in (torch.bfloat16, torch.float16) if re.search(rf"\b{dt}\b", text)}


def _fresh(t: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    """Does ``t`` own a dense storage of its own (not a view of an input, not broadcast, not
    empty: an empty tensor's strides mean nothing)?"""
    if t.numel() == 0 or any(t.untyped_storage().data_ptr() == i.untyped_storage().data_ptr() for i in inputs):
        return False
    return t.numel() == t.untyped_storage().nbytes() // t.element_size() and 0 not in t.stride()


def _strides_where_defined(t: torch.Tensor) -> tuple:
    return tuple(s for s, n in zip(t.stride(), t.shape) if n != 1)


def _assert_bool_bytes(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """A bool's byte is torch's (1 for true): a comparison of values reads any nonzero byte
    as true, torch's own ops then count or convert 0xFF as 255 or -1."""
    if got.dtype == torch.bool:
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), f"{what}: bool bytes " \
            f"{sorted(set(got.view(torch.uint8).flatten().tolist()))}, eager's {{0, 1}}"


def check_program(program: AttackProgram, device: str) -> None:
    fn = program.compile()
    inputs = program.make_arguments(device)
    theirs = clone_args(inputs)
    want = fn(*theirs)
    jfn = thunder.jit(fn, executors=[fuser_ex])
    dtypes = {t.dtype for t in inputs} | {t.dtype for t in want} | _cast_to(program.lines)
    tol = _tolerance(dtypes, len(program.lines))
    for call in range(2):  # the second call runs the regions' straight-line code
        ours = clone_args(inputs)
        try:
            got = jfn(*ours)
        except Exception:
            _unless_thunders_own(fn, inputs)
            raise
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert (g.dtype, g.shape) == (w.dtype, w.shape), f"output {i}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}"
            torch.testing.assert_close(g, w, equal_nan=True, **tol, msg=lambda m: f"output {i}, call {call}: {m}")
            _assert_bool_bytes(g, w, f"output {i}")
            if _fresh(w, theirs) and _fresh(g, ours):
                assert _strides_where_defined(g) == _strides_where_defined(w), f"output {i}: strides {g.stride()}, eager {w.stride()}"
        for k, (o, t) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(o, t, equal_nan=True, **tol, msg=lambda m: f"input {k} after the call: {m}")
            _assert_bool_bytes(o, t, f"input {k} after the call")
    if program.differentiable:
        _check_gradients(fn, inputs, tol)


def _unless_thunders_own(fn, inputs, grads: bool = False) -> None:
    """A program thunder 0.2.6 fails with its own executors too (log_softmax over a dim of no
    elements: its logsumexp's amax refuses it while tracing; the backward of a cat of empty
    slices names a value it never computed) is not ours to judge: drawn again (each such
    failure also has a strict xfail below)."""
    try:
        if grads:
            _gradients_of(thunder.jit(fn), [t.detach().clone().requires_grad_() for t in inputs])
        else:
            thunder.jit(fn)(*clone_args(inputs))
    except Exception:  # noqa: BLE001 - any failure of thunder's own
        assume(False)


def _gradients_of(fn, leaves, weights=None) -> list:
    """Backward of the outputs' sum weighted by ``weights`` (drawn where None); the weights."""
    outs = fn(*leaves)
    if weights is None:
        weights = [torch.randn(o.shape, dtype=torch.float64, device=o.device) for o in outs]
    if any(o.requires_grad for o in outs):
        sum((o.double() * w).sum() for o, w in zip(outs, weights) if o.requires_grad).backward()
    return weights


def _check_gradients(fn, inputs, tol) -> None:
    leaves = [[t.detach().clone().requires_grad_() for t in inputs] for _ in range(2)]
    weights = _gradients_of(fn, leaves[1])
    try:
        _gradients_of(thunder.jit(fn, executors=[fuser_ex]), leaves[0], weights)
    except Exception:
        _unless_thunders_own(fn, inputs, grads=True)
        raise
    for k, (g, w) in enumerate(zip(leaves[0], leaves[1])):
        if w.grad is None:
            continue
        assert g.grad is not None, f"input {k}: eager has a gradient, ours none"
        torch.testing.assert_close(g.grad, w.grad, equal_nan=True, **tol, msg=lambda m: f"gradient of input {k}: {m}")


@settings(max_examples=_examples(100), derandomize=not THOROUGH)
@given(attack_programs())
def test_random_programs_give_eagers_answer(program):
    check_program(program, "cpu")


@settings(max_examples=_examples(100), derandomize=not THOROUGH)
@given(attack_programs())
def test_random_programs_give_eagers_answer_on_lowered_kernels(program):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_FUSER_KERNELS", "torch")
        check_program(program, "cpu")


@settings(max_examples=_examples(100), derandomize=not THOROUGH)
@given(attack_programs(grads=True))
def test_random_programs_give_eagers_gradients(program):
    check_program(program, "cpu")


@pytest.mark.cuda
@settings(max_examples=kernel_examples(1000))
@given(attack_programs())
def test_random_programs_give_eagers_answer_on_cuda_kernels(program):
    check_program(program, "cuda")


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="thunder 0.2.6: the backward of a cat of empty slices fails")
def test_thunders_own_gradient_of_a_cat_of_empty_slices():
    a = torch.randn(1, requires_grad=True)
    thunder.jit(lambda a: torch.cat([a[1:], a[1:] * 2], 0))(a).sum().backward()


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason="thunder 0.2.6: log_softmax over a dim of no elements raises")
def test_thunders_own_log_softmax_over_an_empty_dim():
    thunder.jit(lambda a: torch.log_softmax(a, 0))(torch.randn(0, 3))


@pytest.mark.xfail(strict=True, raises=IndexError, reason="thunder 0.2.6: transpose of a 0-d tensor indexes past its dims")
def test_thunders_own_transpose_of_a_0d_tensor():
    thunder.jit(lambda a: a.transpose(0, -1), executors=[fuser_ex])(torch.tensor(1.0))


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason="thunder 0.2.6: minimum has no gradient rule")
def test_thunders_own_gradient_of_minimum():
    x = torch.randn(3, requires_grad=True)
    thunder.jit(lambda a: torch.minimum(a, a * 2), executors=[fuser_ex])(x).sum().backward()


@pytest.mark.xfail(strict=True, reason="thunder 0.2.6: sigmoid's gradient at -inf is NaN (torch's is 0)")
def test_thunders_own_gradient_of_sigmoid_at_minus_infinity():
    x = torch.tensor([-float("inf"), 0.0], requires_grad=True)
    thunder.jit(torch.sigmoid, executors=[fuser_ex])(x).sum().backward()
    assert not x.grad.isnan().any()


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason="thunder 0.2.6: copy_ from a tensor that broadcasts")
def test_thunders_own_broadcasting_copy_():
    thunder.jit(lambda a, b: a.copy_(b), executors=[fuser_ex])(torch.randn(3, 4), torch.randn(4))
