"""Property: random programs with in-place updates on inputs, views of inputs and
intermediates, with aliasing arguments, give eager's outputs, eager's final input contents,
and raise where eager raises. A failing example prints as a runnable program."""

import pytest
import thunder
import torch
from hypothesis import event, given, reject, settings

from helpers import clone_tensor, compile_planned_kernels_to_ptx, kernel_examples
from inplace_programs import make_arguments, programs
from thunder_fuser import fuser_ex
from thunder_fuser.backends.cute import segment_kernel


def _run(fn, alias, seed, device="cpu"):
    torch.manual_seed(seed)
    args, observed = make_arguments(alias, device)
    try:
        return fn(*args), observed, None
    except Exception as e:  # noqa: BLE001 (compare with eager's error)
        return None, observed, e


def _same(a, b) -> bool:
    try:
        torch.testing.assert_close(a, b)
        return True
    except AssertionError:
        return False


def _thunder_itself_diverges(fn, alias, expected, expected_inputs, eager_raised: bool, device="cpu") -> bool:
    """Whether thunder with its plain torch executor differs from eager on this program:
    then the divergence is thunder's frontend (e.g. it functionalizes ``index_copy_`` whose
    source overlaps its destination, which eager rejects), not this executor."""
    got, inputs, error = _run(thunder.jit(fn, executors=["torch"]), alias, 0, device)
    if eager_raised or error is not None:
        return eager_raised != (error is not None)
    return not (_same(got, expected) and all(_same(a, b) for a, b in zip(inputs, expected_inputs)))


@given(programs())
def test_random_inplace_programs_match_eager(program):
    _check(program, "cpu")


@pytest.mark.cuda
@settings(max_examples=kernel_examples(40))
@given(programs())
def test_random_inplace_programs_match_eager_on_kernels(program):
    """The same programs on generated kernels, which write updates in place themselves
    (``copy_to_out_``); fresh outputs start as NaN, so an unwritten element fails."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(segment_kernel, "FILL_NAN", True)
        _check(program, "cuda")


@settings(max_examples=kernel_examples(20))
@given(programs())
def test_random_inplace_programs_compile_to_ptx(program):
    """Every kernel the torch backend plans for a random in-place program compiles for
    sm_90a on the CPU (a ragged bool mask's tail once failed to, and fell back on the GPU)."""
    fn = program.compile()
    for executors in (None, ["torch"]):  # eager, and thunder itself: either may reject the program
        try:
            (thunder.jit(fn, executors=executors) if executors else fn)(*make_arguments(program.alias)[0])
        except Exception:  # noqa: BLE001 - nothing for our executor to compile
            reject()
    compile_planned_kernels_to_ptx(fn, make_arguments(program.alias)[0])


def _check(program, device):
    fn = program.compile()
    expected, expected_inputs, expected_error = _run(fn, program.alias, 0, device)
    jfn = thunder.jit(fn, executors=[fuser_ex])
    got, got_inputs, error = _run(jfn, program.alias, 0, device)
    event("eager raises" if expected_error is not None else "eager returns")
    if expected_error is not None:
        if error is None and _thunder_itself_diverges(fn, program.alias, None, expected_inputs, True, device):
            reject()
        assert error is not None, f"eager raised {expected_error!r}; fuser_ex returned a result"
        return
    if error is not None:
        if _thunder_itself_diverges(fn, program.alias, expected, expected_inputs, False, device):
            reject()
        raise error
    ok = _same(got, expected) and all(_same(a, b) for a, b in zip(got_inputs, expected_inputs))
    if not ok and _thunder_itself_diverges(fn, program.alias, expected, expected_inputs, False, device):
        reject()
    torch.testing.assert_close(got, expected)
    for a, b in zip(got_inputs, expected_inputs):
        torch.testing.assert_close(a, b, msg=lambda m: f"final input contents differ: {m}")
