"""Elementwise ops read a 0-d value itself, not thunder's broadcast of it
(``ir/scalar_broadcasts.py``), under CUDA's tracing of 0-d tensors (the ``scalars`` fixture
makes the CPU trace them so): results as eager's, no such broadcast left in a region, and
the kernels that read the 0-d value compile."""

import re

import pytest
import thunder
import torch

from helpers import check_vs_eager, compile_planned_kernels_to_ptx
from thunder_fuser import fuser_ex

_BROADCAST_OF_0D = re.compile(r"prims\.broadcast_in_dim\(\w+, \([\d, ]+\), \(\)\)")


def _centered_and_scaled(x, w):
    return (x - x.sum() / x.numel()) * w.amax() + torch.where(x > 0, w.sum(), x)


def test_elementwise_ops_read_the_0d_value(scalars):
    x, w = torch.randn(8, 33), torch.randn(33)
    jfn, _ = check_vs_eager(_centered_and_scaled, x, w, executors=[fuser_ex])
    trace = str(thunder.last_traces(jfn)[-1])
    assert not _BROADCAST_OF_0D.search(trace), _BROADCAST_OF_0D.findall(trace)
    compile_planned_kernels_to_ptx(_centered_and_scaled, (x, w))


@pytest.mark.parametrize("fn", [
    lambda x: x.sum().expand(4, 4) * 2.0,  # no operand of the broadcast's shape beside it: kept
    lambda x: (x.sum().expand(4, 4), x + 1),  # a region output: kept
], ids=["only operand", "region output"])
def test_a_broadcast_the_result_needs_stays(fn, scalars):
    check_vs_eager(fn, torch.randn(4, 4), executors=[fuser_ex])
