"""A pad of an empty tensor is read as its padding value (``ir/empty_pads.py``), and a pad
of merged dims by whole runs pads before the merge (``ir/cat_before_reshape.py``): results
bit for bit as eager's, no pad of an empty tensor left in a region, every segment a kernel."""

import pytest
import thunder
import torch
import torch.nn.functional as F

from helpers import assert_every_segment_ran_a_kernel_forward, check_vs_eager, compile_planned_kernels_to_ptx
from thunder_fuser import fuser_ex


def _plus_empty_tail(y, tail, value):
    """``y`` plus a tail of no columns padded to ``y``'s width: ``y + value`` everywhere,
    as the gradient of litgpt's rotary tail is when every dim is rotated."""
    return y * 2 + F.pad(tail, (0, y.shape[-1]), value=value).to(y.dtype)


@pytest.mark.parametrize("dtype,value", [(torch.float32, 0.0), (torch.bfloat16, 0.1), (torch.float16, -3.0)])
def test_a_pad_of_an_empty_tensor_reads_as_its_value_with_eagers_bits(dtype, value, torch_kernels):
    y = torch.randn(4, 16).to(dtype)
    y[0, :4] = -0.0  # -0.0 * 2 + 0.0 is +0.0: the number must be added, not dropped
    tail = torch.randn(4, 0, dtype=torch.bfloat16)
    jfn = thunder.jit(_plus_empty_tail, executors=[fuser_ex])
    got, want = jfn(y, tail, value), _plus_empty_tail(y, tail, value)
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())
    trace = str(thunder.last_traces(jfn)[-1])
    assert "prims.pad" not in trace and "prims.full" not in trace, trace
    assert_every_segment_ran_a_kernel_forward(jfn)


def test_a_pad_of_an_empty_tensor_the_region_returns_stays(torch_kernels):
    def fn(y, tail):
        z = F.pad(tail, (0, y.shape[-1]))
        return y + z, z

    check_vs_eager(fn, torch.randn(4, 16), torch.randn(4, 0), executors=[fuser_ex])


def _gradient_padded_into_the_projections(dq, scale):
    """q's gradient ``[b, h, s, e]`` back to ``[b, s, h * e]`` and padded into a fused
    projection's gradient of three such pieces, as thunder writes a split's backward."""
    b, h, s, e = dq.shape
    return F.pad((dq * scale).transpose(1, 2).reshape(b, s, h * e), (0, 2 * h * e))


def test_a_pad_of_merged_dims_by_whole_runs_pads_before_the_merge(torch_kernels):
    """No strided view merges h and e of a transposed tensor: padded first along h (by
    whole heads), the merge reshapes what the kernel has just written. Computed over the
    merged shape this segment once ran on torch (transformers' Phi3's attention backward)."""
    args = (torch.randn(2, 4, 8, 16).to(torch.bfloat16), 0.5)
    jfn, _ = check_vs_eager(_gradient_padded_into_the_projections, *args, executors=[fuser_ex])
    assert_every_segment_ran_a_kernel_forward(jfn)
    assert "_split = prims.pad" in str(thunder.last_traces(jfn)[-1])
    compile_planned_kernels_to_ptx(_gradient_padded_into_the_projections, args)


def test_a_pad_of_merged_dims_by_part_of_a_run_stays_a_pad_of_the_merge(torch_kernels):
    def fn(dq):
        b, h, s, e = dq.shape
        return F.pad((dq * 2).transpose(1, 2).reshape(b, s, h * e), (0, 3))

    jfn, _ = check_vs_eager(fn, torch.randn(2, 4, 8, 16), executors=[fuser_ex])
    assert "_split = prims.pad" not in str(thunder.last_traces(jfn)[-1])


def test_a_division_by_a_pad_of_an_empty_tensor_keeps_the_tensor(torch_kernels):
    """A number divisor may be taken as a product with its reciprocal (torch on CUDA): not
    eager's bits, so a division keeps reading the pad."""
    def fn(y, tail):
        return y / F.pad(tail, (0, y.shape[-1]), value=3.0)

    y, tail = torch.randn(4, 16), torch.randn(4, 0)
    jfn = thunder.jit(fn, executors=[fuser_ex])
    assert torch.equal(jfn(y, tail), fn(y, tail))
    assert "prims.pad" in str(thunder.last_traces(jfn)[-1])
