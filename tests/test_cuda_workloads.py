"""The benchmark workloads on a GPU through fuser_ex, against eager (marked ``cuda``; skipped
without a GPU): generated kernels where a template covers the segment, the reference backend
elsewhere (``test_cuda_kernels.py`` asserts which)."""

import pytest
import torch

from benchmarks.workloads import (
    GELU_SCALARS, adam_step, gelu_bias, gelu_bias_backward, layernorm, rmsnorm, rope, rotate_half_residual, softmax,
)
from helpers import check_layernorm_backward, check_vs_eager, check_vs_float64

pytestmark = pytest.mark.cuda


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pointwise_and_normalizations(dtype):
    check_vs_eager(gelu_bias, _randn(64, 4097, dtype=dtype), _randn(4097, dtype=dtype))
    check_vs_eager(softmax, _randn(64, 4097, dtype=dtype))
    check_vs_eager(rmsnorm, _randn(64, 4097, dtype=dtype), _randn(4097, dtype=dtype))
    check_vs_eager(layernorm, _randn(64, 4097, dtype=dtype), _randn(4097, dtype=dtype), _randn(4097, dtype=dtype))
    check_vs_eager(rotate_half_residual, _randn(2, 4, 33, 128, dtype=dtype))


def test_rope_llama_shapes_and_noncontiguous_inputs():
    q = _randn(2, 128, 32, 128).transpose(1, 2)  # [b, h, s, d] laid out as [b, s, h, d]
    k = _randn(2, 128, 8, 128).transpose(1, 2)
    cos, sin = _randn(128, 128), _randn(128, 128)
    check_vs_eager(rope, q, k, cos, sin)


def test_gelu_bias_backward_and_adam():
    # the bias gradient sums 8,192 rows: compared with float64 beside eager's own error
    check_vs_float64(gelu_bias_backward, *[_randn(16, 512, 256) for _ in range(3)], *GELU_SCALARS)
    args = [[_randn(s) for s in [(4097,), (64, 129)]] for _ in range(4)]
    args[3] = [a.abs() for a in args[3]]
    check_vs_eager(adam_step, *args)


def test_layernorm_backward():
    check_layernorm_backward("cuda", (64, 4097))
