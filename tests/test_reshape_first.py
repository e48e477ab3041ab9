"""``ir/reshape_first.py``: a reshape moved before the pointwise ops that make its operand,
so that they take the domain of the reduction it feeds (and never into a reduction's)."""

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser
from helpers import check_vs_eager, compile_planned_kernels_to_ptx, plans


def _conv1d_block(x, w, b, res, g, beta):
    """GPT-2's (transformers' Conv1D): a projection over ``[b * s, n]`` with its bias, the
    residual added over ``[b, s, n]``, then the next LayerNorm, its output flattened again."""
    n = x.shape[-1]
    h = torch.addmm(b, x.reshape(-1, n), w).reshape(res.shape) + res
    return h, F.layer_norm(h, (n,), g, beta).reshape(-1, n)


def _kernels(fn, args):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_FUSER_KERNELS", "torch")
        jfn = thunder.jit(fn, executors=thunder_fuser.executors())
        jfn(*args)
    return [k for p in plans(thunder.last_traces(jfn)[-1]) for _, k in sorted(p.kernels.items()) if k]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_flattened_projections_bias_and_residual_join_the_next_norms_kernel(dtype):
    """The bias add (over ``[b * s, n]``) and the residual add and LayerNorm (over ``[b, s, n]``)
    are one normalization kernel, its bf16 output rounded inside it: GPT-2 had three kernels a
    norm, the norm reading the adds' fp32 upcast back from memory (hf-GPT2 2 layers, tiny:
    22 forward kernels, now 14; gemma-2's norms the same). Values as eager's, and the
    kernels compile for sm_90a."""
    torch.manual_seed(0)
    x, res = torch.randn(2, 16, 64, dtype=dtype), torch.randn(2, 16, 64, dtype=dtype)
    w, b = torch.randn(64, 64, dtype=dtype) / 8, torch.randn(64, dtype=dtype)
    g, beta = torch.randn(64, dtype=dtype), torch.randn(64, dtype=dtype)
    args = (x, w, b, res, g, beta)
    check_vs_eager(_conv1d_block, *args)
    kernels = _kernels(_conv1d_block, args)
    assert len(kernels) == 1, [k.parts[0].prog.family for k in kernels]
    compile_planned_kernels_to_ptx(_conv1d_block, args)


def test_an_op_of_several_operands_keeps_its_domain_where_no_reduction_reads_the_reshape():
    """SwiGLU's backward flattened for the projections' gradients: no reduction reads the
    flattened values, so the ops stay over ``[b, s, n]`` with the other outputs, one kernel
    (moving the product's reshape split it from the op beside it reading the same operands:
    transformers' Qwen2 and ViT got a kernel more a layer)."""
    def f(a, b, g):
        da = (g * b * torch.sigmoid(a)).reshape(-1, a.shape[-1])
        return da, g * a

    args = [torch.randn(2, 16, 64) for _ in range(3)]
    check_vs_eager(f, *args)
    assert len(_kernels(f, args)) == 1


def test_a_reshape_below_a_reduction_stays_below_the_ops_after_it():
    """A norm's output rounded and then flattened: the rounding stays in the norm's kernel
    (a reduction above a reshape anchors it), one kernel, and values as eager's."""
    def f(h, g):
        return F.layer_norm(h.float(), (h.shape[-1],), g).to(torch.bfloat16).reshape(-1, h.shape[-1])

    args = (torch.randn(2, 16, 64, dtype=torch.bfloat16), torch.randn(64))
    check_vs_eager(f, *args)
    assert len(_kernels(f, args)) == 1
