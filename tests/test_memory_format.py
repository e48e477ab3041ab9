"""``Tensor.to`` with ``memory_format`` through thunder + fuser as in torch
(``patches/memory_format.py``): thunder's ``to`` dropped the format whenever it converted
the dtype, and knew no ``contiguous_format``; our kernels wrote the strides the trace said."""

from __future__ import annotations

import pytest
import thunder
import torch

import thunder_fuser

CL, CL3, DENSE = torch.channels_last, torch.channels_last_3d, torch.contiguous_format


def _input(shape, fmt, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return x.contiguous(memory_format=fmt)


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("into,given,shape", [(CL, DENSE, (2, 3, 4, 5)), (DENSE, CL, (2, 3, 4, 5)),
                                              (CL3, DENSE, (2, 3, 4, 5, 6)), (CL, CL, (2, 3, 4, 5)),
                                              (torch.preserve_format, CL, (2, 3, 4, 5))])
@pytest.mark.parametrize("computed", [False, True])
def test_to_lays_its_result_out_in_the_format_asked_for(dtype, into, given, shape, computed):
    def f(x):
        y = x * 2 if computed else x
        return y.to(dtype, memory_format=into) if dtype else y.to(memory_format=into)

    x = _input(shape, given)
    before = x.clone()
    got, want = thunder.jit(f, executors=thunder_fuser.executors())(x), f(x)
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(x, before)


def test_the_gradient_through_a_format_change_is_eagers():
    def f(x, w):
        return (x.to(torch.float64, memory_format=CL) * w).sum()

    x, w = _input((2, 3, 4, 5), DENSE).requires_grad_(), torch.randn(5, dtype=torch.float64, requires_grad=True)
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    thunder.jit(f, executors=thunder_fuser.executors())(x, w).backward()
    f(xr, wr).backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)
    assert x.grad.stride() == xr.grad.stride()


def test_a_format_of_the_wrong_rank_is_refused():
    with pytest.raises(Exception, match="4D"):
        thunder.jit(lambda x: x.to(torch.float64, memory_format=CL), executors=thunder_fuser.executors())(torch.randn(3, 4))
