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


def _odd(shape, dtype, kind):
    """Values with NaN, infinities, -0 and huge entries (``kind``), or plain ones."""
    t = torch.randn(shape, dtype=torch.float32)
    if kind == "special":
        flat = t.view(-1)
        flat[::7], flat[1::11], flat[2::13], flat[3::17] = float("nan"), float("inf"), -float("inf"), -0.0
    elif kind == "huge":  # a product's square still finite: past that eager's norm is NaN, ours 0 (both overflow)
        t = t * 1e9 if dtype == torch.float32 else t * 3e4
    return t.to(dtype)


def _moved_programs():
    """Programs the rule was not written for: a row-scaled residual, a bias per row (kept in
    place: its dim is merged), a bias of shape (1, n), a transposed projection output (no
    view), an alias of one input read twice, an in-place write before the reshape, and a
    sum over the reshaped rows (a loss)."""
    def per_row_bias(x2, rb, res):  # rb broadcast along dim 0, which the reshape splits
        return F.layer_norm((x2 + rb[:, None]).reshape(res.shape) + res, (res.shape[-1],))

    def one_row_bias(x2, b1, res):  # a (1, n) bias: its size-1 dim broadcast over the merged rows
        return F.layer_norm((x2 + b1).reshape(res.shape) * res, (res.shape[-1],))

    def transposed(x2t, b, res):  # a transposed [b*s, n]: the reshape cannot view it
        return F.layer_norm((x2t.t() + b).reshape(res.shape) - res, (res.shape[-1],))

    def aliased(x2, b, res):  # res is x2 again, viewed
        return F.layer_norm(torch.where(x2 > 0, x2, b).reshape(res.shape) + res, (res.shape[-1],))

    def written(x2, b, res):
        y = x2 * b
        res.mul_(2.0)  # written in place between the product and the norm reading it
        return F.layer_norm(y.reshape(res.shape) + res, (res.shape[-1],)), res

    def loss(x2, b, res):
        return (torch.exp(x2 - b).reshape(res.shape) * res).sum(-1)

    return {"per-row bias": per_row_bias, "(1, n) bias": one_row_bias, "transposed": transposed,
            "aliased": aliased, "written": written, "loss": loss}


@pytest.mark.parametrize("kind", ["plain", "special", "huge"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(_moved_programs()))
def test_moved_reshapes_are_eagers_on_odd_programs_and_inputs(name, dtype, kind):
    """Each program of ``_moved_programs`` on NaN/inf/-0, huge and plain values, fp32 and
    bf16: outputs (values, strides) and inputs as eager's, and the gradients as eager's."""
    fn = _moved_programs()[name]
    torch.manual_seed(0)
    b, s, n = 2, 8, 32
    x2 = _odd((b * s, n), dtype, kind)
    res = _odd((b, s, n), dtype, kind)
    second = {"per-row bias": _odd((b * s,), dtype, kind), "(1, n) bias": _odd((1, n), dtype, kind)}.get(
        name, _odd((n,), dtype, kind))
    if name == "transposed":
        x2 = x2.t().contiguous()  # [n, b*s], read transposed
    if name == "aliased":
        res = x2.view(b, s, n)
    jfn, got = check_vs_eager(fn, x2, second, res)
    want = fn(*(a.clone() for a in (x2, second, res)))
    for g, w in zip(*(o if isinstance(o, tuple) else (o,) for o in (got, want))):
        assert g.stride() == w.stride(), (g.stride(), w.stride())
    if kind == "plain" and name not in ("aliased", "written"):
        leaves = [a.clone().requires_grad_() for a in (x2, second, res)]
        mine = [a.clone().requires_grad_() for a in (x2, second, res)]
        cotangent = torch.randn(want.shape, dtype=dtype)  # a norm's plain sum has a zero gradient
        (fn(*leaves) * cotangent).sum().backward()
        (thunder.jit(fn, executors=thunder_fuser.executors())(*mine) * cotangent).sum().backward()
        tol = {} if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)  # bf16 sums of 32-256 terms
        for m, l in zip(mine, leaves):
            torch.testing.assert_close(m.grad, l.grad, equal_nan=True, **tol)


def test_a_0d_operand_beside_full_ones_is_not_reshaped():
    """A 0-d tensor (a CPU scalar) among the op's operands: the rule leaves the op where it
    is, and the values are eager's."""
    def f(x2, t, res):
        return F.layer_norm((x2 * t).reshape(res.shape) + res, (res.shape[-1],))

    check_vs_eager(f, torch.randn(16, 32), torch.tensor(1.5), torch.randn(2, 8, 32))
