"""Kernel generation on the CPU: lowering and geometry run end to end through torch
(``THUNDER_FUSER_KERNELS=torch``), and every kernel family compiles to PTX with CuTe DSL
(``CUTE_DSL_ARCH=sm_90a``, fake tensors, no GPU), so a codegen regression fails CI."""

from __future__ import annotations

import os
import re
import warnings

import pytest
import thunder
import torch

from benchmarks.workloads import (
    GELU_SCALARS, adam_step, gelu_bias, gelu_bias_backward, layernorm, rmsnorm, rope, rotate_half_residual, softmax,
)
from helpers import (
    _qkv_gradient_cat,
    assert_every_segment_ran_a_kernel,
    assert_every_segment_ran_a_kernel_forward,
    compile_planned_kernels_to_ptx,
    ptx_text,
    rope_from_one_projection,
    BOOL_STORES,
    CREATION_CASES, STAGED_REDUCTIONS, causal_attention, causal_mask_scores,
    check_a_misaligned_call_runs_a_shared_launch_apart,
    check_batch_norm_backward, check_gradients, check_layernorm_backward, check_norm_backward, check_vs_eager,
    check_vs_float64, integer_division, norm_backward, norm_backward_args, planned_parts, plans, signed_operands, three_shapes, TWO_LEVEL_RESIZES,
)
from thunder_fuser import explain, fuser_ex
from thunder_fuser.backends.cute import backend, segment_kernel
from thunder_fuser.backends.cute.tiling import columns_geometry, pointwise_geometry, rows_geometry
from thunder_fuser.backends.cute.backend import KernelFallbackWarning
from thunder_fuser.runtime import plan as plan_mod


def _plans(jfn):
    return plans(thunder.last_traces(jfn)[-1])


def _kernels(jfn):
    """(segment kind, SegmentKernel or None) of every segment the last call planned."""
    return [(p.decision.kinds[i], k) for p in _plans(jfn) for i, k in sorted(p.kernels.items())]


def _r(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


WORKLOADS = {
    "gelu_bias ragged": (gelu_bias, lambda: (_r(33, 4097), _r(4097))),
    "gelu_bias bf16": (gelu_bias, lambda: (_r(33, 4096, dtype=torch.bfloat16), _r(4096, dtype=torch.bfloat16))),
    "softmax": (softmax, lambda: (_r(37, 1000),)),
    "rmsnorm bf16": (rmsnorm, lambda: (_r(37, 4096, dtype=torch.bfloat16), _r(4096, dtype=torch.bfloat16))),
    "layernorm": (layernorm, lambda: (_r(37, 4097), _r(4097), _r(4097))),
    "rotate-half residual": (rotate_half_residual, lambda: (_r(2, 4, 33, 128),)),
    "rope, non-contiguous q/k": (
        rope, lambda: (_r(2, 16, 4, 128).transpose(1, 2), _r(2, 16, 2, 128).transpose(1, 2), _r(16, 128), _r(16, 128))
    ),
    "transposed input": (lambda a, b: a * b + 1, lambda: (_r(300, 257).t(), _r(257, 300))),
    "adam (copy_to_out_)": (adam_step, lambda: tuple([_r(4097), _r(64, 129).abs()] for _ in range(4))),
    "column reductions": (
        lambda x: (x.sum(0), x.amax(0), x.mean((0, 1)), x.prod(0), x.var(0), torch.var_mean(x, (0, 1), correction=0)),
        lambda: (1 + 0.01 * _r(30, 20, 257),),
    ),
    "row prod": (lambda x: torch.prod(x, -1), lambda: (1 + 0.01 * _r(37, 1000),)),
    "channels-last batch norm (column stats, then normalize)": (
        lambda x, w, b, rm, rv: torch.nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1),
        lambda: (_r(8, 16, 10, 10).to(memory_format=torch.channels_last), _r(16), _r(16), _r(16), _r(16).abs()),
    ),
    "cat and pad along outer dims": (
        lambda x, y: (torch.cat((x.exp(), y), 1) * 2, torch.nn.functional.pad(x, (0, 0, 1, 2), value=1.5)),
        lambda: (_r(2, 3, 16), _r(2, 5, 16)),
    ),
    "cat along a dim that is innermost for no output": (
        lambda x, y: torch.cat((x, y), 1) + 1, lambda: (_r(16, 4).t(), _r(16, 4).t())
    ),
    "#785 bias gradient": (gelu_bias_backward, lambda: (*[_r(2, 16, 256) for _ in range(3)], *GELU_SCALARS)),
    "rows too long for registers": (
        lambda x: (torch.softmax(x, -1), x.var(-1)), lambda: (_r(3, 70000),)
    ),
    "integer division (truncating, floor)": (integer_division, lambda: signed_operands((33, 257), torch.int32)),
}


@pytest.mark.parametrize("name", WORKLOADS)
def test_lowered_programs_compute_what_the_reference_does(torch_kernels, name):
    fn, make = WORKLOADS[name]
    jfn, _ = check_vs_eager(fn, *make())
    kinds = _kernels(jfn)
    assert kinds and all(k is not None for kind, k in kinds if kind != "view"), kinds


@pytest.mark.parametrize("name", CREATION_CASES)
def test_iota_and_full_run_in_kernels(torch_kernels, name):
    """A causal mask, a tril of ones, constant and bool outputs: no segment falls back."""
    fn, shapes = CREATION_CASES[name]
    jfn, _ = check_vs_eager(fn, *[_r(*s) for s in shapes])
    kinds = _kernels(jfn)
    assert kinds and all(k is not None for kind, k in kinds if kind != "view"), kinds


def test_a_causal_mask_is_read_as_two_iota_vectors_never_stored(torch_kernels):
    """The kernel reads each iota once per plan-built ``[s]`` vector and compares per element."""
    s = _r(2, 4, 64, 64)
    jfn, _ = check_vs_eager(lambda x: torch.softmax(causal_mask_scores(x), -1), s)
    (kind, k), = _kernels(jfn)
    loads = [ld.source for p in k.parts for ld in p.prog.loads]
    assert sorted((v.dtype, v.numel) for v in loads if v.dtype == torch.int64) == [(torch.int64, 64)] * 2, loads
    assert [st.target.dtype for p in k.parts for st in p.prog.stores] == [torch.float32]


def test_causal_attention_forward_and_backward_run_on_kernels(torch_kernels):
    """Without sdpa_ex thunder decomposes causal SDPA; its softmax segments all lower."""
    q, k, v = (_r(2, 4, 33, 16) for _ in range(3))
    check_gradients(causal_attention, q, [k, v], require_kernels=True)

def _rstd_and_its_broadcast(x):
    r = torch.rsqrt(x.var(-1, keepdim=True) + 1e-5)
    return x * r, r.expand(x.shape)


def test_row_store_of_a_broadcast_value_writes_the_whole_row(torch_kernels):
    """A row value returned broadcast to [n, d] (what layernorm's forward saved for its
    backward before rematerialization) is stored over the whole row."""
    jfn, _ = check_vs_eager(_rstd_and_its_broadcast, _r(64, 512))
    assert all(k is not None for _, k in _kernels(jfn))


def test_layernorm_backward_lowers(torch_kernels):
    check_layernorm_backward("cpu", (64, 512), require_kernels=True)


def test_transformer_block_forward_and_backward(torch_kernels):
    """The benchmark's GPT block (layernorm, causal attention decomposed, tanh-GELU MLP),
    rematerialized between forward and backward: output and every gradient match eager."""
    from benchmarks.workloads import TransformerBlock

    torch.manual_seed(0)
    block = TransformerBlock(64, 4)
    ref = TransformerBlock(64, 4)
    ref.load_state_dict(block.state_dict())
    x = _r(2, 16, 64).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y = thunder.jit(block, executors=[fuser_ex])(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    want = ref(xr)
    want.backward(grad)
    torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-4, rtol=1e-4)
    for (name, p), q in zip(block.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)


def test_channels_last_batch_norm_backward_splits_at_column_reductions(torch_kernels):
    """Forward and backward of a channels-last batch norm: column reductions whose results
    the whole domain uses run as two programs (statistics, then the elementwise pass)."""
    check_batch_norm_backward("cpu", (8, 16, 10, 10))




@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", STAGED_REDUCTIONS)
def test_reduced_dims_runs_apart_reduce_in_two_stages_and_explain_says_so(torch_kernels, name, dtype):
    """A reduction over dims that are runs apart in memory (an NCHW batch norm's statistics
    over N, H and W) ran on the reference backend; it now runs as two row kernels, over
    the innermost run into fp32 partials, then over the rest."""
    fn, shape = STAGED_REDUCTIONS[name]
    jfn, _ = check_vs_float64(fn, _r(*shape, dtype=dtype))
    assert "reduces over dims (2,) first" in explain(jfn) or "reduces over dims (2, 3) first" in explain(jfn), explain(jfn)
    kinds = [k for plan in _plans(jfn) for k in plan.decision.kinds.values()]
    assert "reference" not in kinds, explain(jfn)
    if name.startswith("var_mean over N"):  # var_mean's halves share one partial mean: 2 partials, not 3
        first = next(p for _, k in _kernels(jfn) for p in k.parts if p.first_stage)
        assert len(first.prog.stores) == 2, [st.target.name for st in first.prog.stores]


def test_nchw_batch_norm_forward_and_backward_run_on_kernels(torch_kernels):
    check_batch_norm_backward("cpu", (8, 16, 10, 10), memory_format=torch.contiguous_format)


def test_a_failing_kernel_falls_back_with_one_warning(monkeypatch):
    """Any failure in generation or compilation: the reference backend runs the segment,
    one warning names the segment and the reason, and the results are right."""
    monkeypatch.setattr(plan_mod, "kernel_mode", lambda env, region: "cute")

    def broken(prog, geo, device, defer=False):
        raise RuntimeError("codegen exploded")

    monkeypatch.setattr(segment_kernel, "compile_program", broken)
    backend.forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jfn, _ = check_vs_eager(gelu_bias, _r(8, 64), _r(64))
        jfn(_r(8, 64), _r(64))
    msgs = [str(w.message) for w in caught if issubclass(w.category, KernelFallbackWarning)]
    assert len(msgs) == 1, msgs
    assert "segment 0 (pointwise) runs on the reference backend: RuntimeError: codegen exploded" in msgs[0]
    assert [kind for kind, _ in _kernels(jfn)] == ["reference"]


def test_a_segment_the_reference_backend_ran_for_one_call_leaves_its_outputs_where_the_kernel_would(torch_kernels):
    """A kernel declines a call whose pointers break its alignment; the reference backend
    then runs its segment. A later kernel of the plan reads the outputs through views fixed
    at its first call, so they are copied into the kernel's layout where torch's differs
    (``SegmentKernel.conform``)."""
    from thunder_fuser.backends import reference

    def f(x, w):
        return (torch.tanh(x) * 2).transpose(1, 2) @ w

    x, w = _r(4, 64, 32), _r(4, 64, 16)
    jfn, _ = check_vs_eager(f, x, w)
    k = next(k for p in _plans(jfn) for k in p.kernels.values() if k is not None)
    ((target, (_, strides, _)),) = [(t, a) for part in k.parts for t, a in part.store_recipe if a is not None]
    assert strides != torch.empty(4, 32, 64).stride()  # stored for the matmul, not contiguous
    env = {id(v): x for v in k.seg.inputs}
    reference.run_nodes(k.seg.nodes, env)
    env[target] = want = env[target].contiguous()  # a layout torch could have given it
    k.conform(env)
    assert env[target].stride() == strides
    torch.testing.assert_close(env[target], want)


def test_a_transposed_reduction_result_is_not_a_row_value(torch_kernels):
    """einsum's ``...a,...a->...`` transposes a row sum before storing it: the stored value
    is not the reduction's rows in their order, so it is not lowered as one (a wrong result
    found by thunder's OpInfo suite run through the lowered programs)."""
    def f(a, b):
        return torch.einsum("...a,...a->...", a, b)

    a, b = _r(4), _r(4, 4, 4)
    # without autograd thunder keeps the transpose in the reduction's segment
    got = thunder.jit(f, executors=[fuser_ex], disable_torch_autograd=True)(a, b)
    torch.testing.assert_close(got, f(a, b))


def test_an_output_that_views_another_output_stays_a_view(torch_kernels):
    """``e = c.view(-1)`` leaves the kernel as a view of ``c``, not a copy: the in-place
    ``e += ...`` that follows must change ``c`` too (thunder's test_inplace_on_view)."""

    def f(x, y):
        c = torch.exp(x)
        d = torch.tanh(y)
        e = c.view(-1)
        e += d.flatten()
        d.div_(x)
        return c, d, e

    check_vs_eager(f, _r(2, 3), _r(2, 3))


def test_empty_tensors_run_on_the_reference_backend(torch_kernels):
    """A kernel over an empty domain would launch an empty grid: the segment runs on torch."""
    jfn, _ = check_vs_eager(lambda x: (x * 2, x.sum(1)), _r(3, 0))
    assert {kind for kind, _ in _kernels(jfn)} == {"reference"}


@pytest.mark.parametrize("name", TWO_LEVEL_RESIZES)
def test_pieces_shifted_along_two_dims_or_twice_along_one(torch_kernels, name):
    """A pad of two dims (one select per dim, nested), a pad of a cat, a cat of pads, and
    one tensor read as two pieces: each runs as one lowered program and matches eager."""
    fn, args = _two_level(name)
    jfn, _ = check_vs_eager(fn, *args())
    assert [kind for kind, _ in _kernels(jfn)] == ["resize"] and all(k for _, k in _kernels(jfn))


def test_a_reshape_that_cuts_a_cat_dim_is_computed_before_it_where_its_operands_allow(torch_kernels):
    """Splitting the cat dim puts pieces on both sides of a new dim: an op over such a value
    is computed over the cat's shape and stored through the reshape, its other operands
    read through the inverse reshape (numbers, and tensors whose strides allow that view);
    a tensor whose strides do not (a broadcast or a slice merged with its neighbour) sends
    the segment to the reference backend, saying why."""
    def cat_cut(a, b):
        return torch.cat((a, b), -1).reshape(4, 2, 48)

    for c in (None, _r(4, 2, 48)):
        args = (_r(4, 32), _r(4, 64)) + ((c,) if c is not None else ())
        jfn, _ = check_vs_eager(lambda a, b, *c: cat_cut(a, b) + (c[0] if c else 1), *args)
        assert [kind for kind, _ in _kernels(jfn)] == ["resize"]
    for c in (_r(4, 1, 48).expand(4, 2, 48), _r(4, 2, 50)[:, :, 1:49]):
        jfn, _ = check_vs_eager(lambda a, b, c: cat_cut(a, b) + c, _r(4, 32), _r(4, 64), c)
        assert ("reference", None) in _kernels(jfn)
        assert "needs a copy at these strides" in explain(jfn), explain(jfn)


def test_an_output_reshaped_for_a_matmul_is_stored_in_its_siblings_launch(torch_kernels):
    """A SwiGLU's backward: the up projection's gradient is stored as the [tokens, hidden]
    matrix its matmuls read, the gate's as [batch, seq, hidden]. Stored over the shape before
    the reshape (its target viewed so), the first joins the second's launch and the operands
    are read once; where the planned layout cannot take that view, or the launch's other
    operands cannot be read over that shape at their strides, it keeps a launch of its own."""
    def swiglu_backward(a, b, g):
        sa = torch.nn.functional.silu(a.float())
        d_up = (g.float() * sa).to(a.dtype).reshape(-1, a.shape[-1])
        d_gate = (g.float() * b.float() * torch.sigmoid(a.float()) * (1 + a.float() * (1 - torch.sigmoid(a.float()))))
        return d_gate.to(a.dtype), d_up

    args = tuple(_r(2, 8, 64, dtype=torch.bfloat16) for _ in range(3))
    jfn, _ = check_vs_eager(swiglu_backward, *args)
    (k,) = [k for _, k in _kernels(jfn)]
    assert len(k.parts) == 1, [p.prog.domain for p in k.parts]
    assert sorted(tuple(st.target.shape) for st in k.parts[0].prog.stores) == [(2, 8, 64), (16, 64)]

    from thunder_fuser.backends.cute.lower.expr import _views_as
    from thunder_fuser.ir.region import Value

    up = Value("up", (2, 8, 64), torch.bfloat16)  # stored over [16, 64]: its first two dims merge
    assert _views_as(up, {}, (16, 64)) and _views_as(up, {id(up): (0, 1, 2)}, (16, 64))
    assert not _views_as(up, {id(up): (1, 0, 2)}, (16, 64))  # seq outermost: a launch of its own


def test_an_output_stored_over_its_sources_shape_compiles_to_ptx(ptx_compile):
    """The launch above, generated: its reshaped output's store is a view of the target."""
    def fn(a, g):
        return (g.float() * a.float()).to(a.dtype), (g.float() * torch.sigmoid(a.float())).to(a.dtype).reshape(-1, 64)

    args = (_r(2, 8, 64, dtype=torch.bfloat16), _r(2, 8, 64, dtype=torch.bfloat16))
    (part,) = planned_parts(fn, args)
    assert ".target sm_90a" in ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cast_of_transposed_pieces_concatenated_first_is_computed_before_the_merge(torch_kernels, dtype):
    """The q, k, v gradients joined into the fused projection's (concatenated along h first,
    then merged: ``ir/cat_before_reshape.py``), cast to fp32 and summed for the projection's
    bias, the joined gradient also read by the weight's matmul (phi-2's attention backward
    through ThunderFX, bf16). The cast of the merged value once fell back to torch in every
    layer (0.9 ms of copies per phi-2 step on the H200); a pointwise op over such a value,
    with numbers or 0-d tensors beside it, is computed over the shape before the merge and
    stored through it, as the cat itself."""
    def fn(dq, dk, dv, x, w, scale):
        g = _qkv_gradient_cat(dq, dk, dv)
        return (g.float() * scale + 1.0).sum(0).to(dq.dtype), g.t() @ x, g @ w

    jfn, _ = check_vs_eager(fn, *(t.to(dtype) for t in (_r(2, 4, 16, 64), _r(2, 4, 64, 16), _r(2, 4, 16, 64), _r(32, 8), _r(768, 8))),
                            torch.tensor(0.5))
    kernels = _kernels(jfn)
    assert kernels and all(kind != "reference" for kind, _ in kernels), kernels


def test_transposed_pieces_of_different_inner_extents_are_not_concatenated_first(torch_kernels):
    """cat(reshape(x_i)) is reshape(cat(x_i)) only when the pieces agree on the dims merged
    inside the cat dim: [2, 8, 3, 4] and [2, 8, 2, 6] both merge to 12 wide, but
    concatenating along their third dims would interleave them wrongly."""
    def fn(a, b):
        return torch.cat((a.transpose(1, 2).reshape(2, 8, 12), b.transpose(1, 2).reshape(2, 8, 12)), -1) * 2

    jfn, _ = check_vs_eager(fn, _r(2, 3, 8, 4), _r(2, 2, 8, 6))
    (plan,) = _plans(jfn)
    assert not any(n.output.name.endswith("_split") for n in plan.decision.region.nodes)


def test_unsupported_segment_reason(torch_kernels):
    """A pad of two dims neither of which is the fastest in memory has no template: the
    segment runs on the reference backend, and explain() says why."""
    jfn, _ = check_vs_eager(lambda x: torch.nn.functional.pad(x * 2, (0, 0, 1, 1, 2, 2)), _r(6, 5, 33))
    assert ("reference", None) in _kernels(jfn)
    assert "segment 0 runs as reference (cat/pad along dims [0, 1], neither of them the fastest in memory)" in explain(jfn)


def test_a_few_long_rows_split_across_blocks_and_explain_says_so(torch_kernels):
    """A row kernel runs one block per row: a few long rows (a loss's ``.sum()``: one row)
    split each row across blocks, whose partials a second launch combines; explain() says
    so. A layer norm over up to 66 such rows (``rows_geometry.SPLIT_MIN`` splits each in one
    wave) runs its statistics split and then a pointwise pass, over 67 as a row kernel. A
    softmax of one long row runs its max split, then its sum of exp(x - max) split, then
    the division."""
    n = 2**18

    def split_rows(jfn):
        return [part.geo.split_rows for kind, k in _kernels(jfn) if k for part in k.parts]

    jfn, _ = check_vs_float64(lambda x: (x * 2).sum(), _r(n))
    assert split_rows(jfn) == [True]
    splits, _ = rows_geometry.row_splits(1, n, 4, 132)
    assert splits == n // (4 * rows_geometry.SPLIT_THREADS * rows_geometry.SPLIT_MIN_VECTORS)
    assert (f"segment 0 splits each row of its reduction across {splits} blocks, then combines their partials "
            "in a second launch") in explain(jfn)
    most = rows_geometry.SPLIT_BLOCKS_PER_SM * 132 // rows_geometry.SPLIT_MIN
    assert most == 66
    jfn, _ = check_vs_eager(lambda x: torch.nn.functional.layer_norm(x, (n,)), _r(most, n))
    assert split_rows(jfn) == [True, False]
    jfn, _ = check_vs_eager(lambda x: torch.nn.functional.layer_norm(x, (n,)), _r(most + 1, n))
    assert split_rows(jfn) == [False]
    jfn, _ = check_vs_eager(softmax, _r(1, n))
    assert split_rows(jfn) == [True, True, False] and "reference" not in explain(jfn)


def test_rows_too_long_for_registers_take_max_and_sum_in_one_pass_and_explain_says_so(torch_kernels):
    """A row past ``rows_geometry.REGISTER_ROW_ELEMENTS`` loops over global memory, a pass per
    reduction; a softmax's max and its sum of exp(x - max) share one (online softmax) where
    the exp and the subtraction are in fp32 (an fp16 logsumexp rounds them, and keeps its
    two passes)."""
    n = 30000
    for fn, x, passes in (
        (lambda x: torch.log_softmax(x.float(), -1), _r(80, n, dtype=torch.bfloat16),
         "a pass per reduction (the max and the sum of exp(x - max) in one: online softmax), then one for its stores"),
        (lambda x: torch.logsumexp(x.float(), -1), _r(80, n, dtype=torch.bfloat16),
         "a pass per reduction (the max and the sum of exp(x - max) in one: online softmax)\n"),
        (softmax, _r(80, n), "a pass per reduction (the max and the sum of exp(x - max) in one: online softmax), "
         "then one for its stores"),
        (lambda x: torch.logsumexp(x, -1), _r(80, n, dtype=torch.float16), "a pass per reduction\n"),
        (lambda x: torch.nn.functional.layer_norm(x, (n,)), _r(80, n), "a pass per reduction, then one for its stores"),
    ):
        jfn, _ = check_vs_eager(fn, x)
        text = explain(jfn) + "\n"
        assert f"segment 0 loops over rows too long for registers ({n} elements): {passes}" in text, text
    jfn, _ = check_vs_eager(softmax, _r(80, 1000))
    assert "loops over rows" not in explain(jfn)


def test_an_operand_contiguous_along_another_dim_is_staged_and_explain_says_so(torch_kernels):
    """x + y.t(): y is contiguous along the output's rows, so a kernel reads it through
    shared-memory tiles (``pointwise_geometry.transpose_stage``); explain() names it. Not where that
    dim is too short to fill a tile (nor in a row reduction: see the next test)."""

    def stages(jfn):
        return [part.geo.stage for kind, k in _kernels(jfn) if k for part in k.parts]

    jfn, _ = check_vs_eager(lambda x, y: x + y.t(), _r(64, 96), _r(96, 64))
    assert stages(jfn) == [(0, (1,))]
    assert ("segment 0 reads y through shared-memory tiles (a tiled transpose: it is contiguous along another dim "
            "than the output)") in explain(jfn)
    jfn, _ = check_vs_eager(lambda x, y, z: x * y.transpose(1, 2) + z.transpose(1, 2), _r(2, 64, 96), _r(2, 96, 64),
                            _r(2, 96, 64))
    assert stages(jfn) == [(0, (1, 2))]
    assert "reads y, z through shared-memory tiles (a tiled transpose: they are" in explain(jfn)


    def copy_into(x, y):
        x.copy_(y.t())
        return x

    jfn, _ = check_vs_eager(copy_into, _r(64, 96), _r(96, 64))  # a pointwise copy, not a reduction's
    assert stages(jfn) == [(0, (0,))] and "reads y through shared-memory tiles" in explain(jfn)
    short = pointwise_geometry.STAGE_MIN_ROWS - 1
    jfn, _ = check_vs_eager(lambda x, y: x + y.t(), _r(short, 96), _r(96, short))
    assert stages(jfn) == [()] and "shared-memory" not in explain(jfn)


def test_a_column_var_merges_fewer_splits_than_a_column_sum(torch_kernels):
    """The second launch of a column reduction walks every split of a column: a sum's adds
    are cheap, so 256 columns over many rows make 8 blocks per SM of splits (1056 on 132
    SMs); var's merges divide, so it makes at most ``COLUMN_VAR_SPLITS_PER_SM`` per SM."""
    x = _r(65536, 256, dtype=torch.bfloat16)
    (p,) = planned_parts(lambda x: x.sum(0), (x,))
    per = -(-65536 // (columns_geometry.COLUMN_BLOCKS_PER_SM * 132))  # rows per split
    assert p.geo.splits == (-(-65536 // per), per)  # 1041 splits of 63 rows
    (p,) = planned_parts(lambda x: torch.var_mean(x.float(), 0), (x,))
    per = -(-65536 // (columns_geometry.COLUMN_VAR_SPLITS_PER_SM * 132))
    assert p.geo.splits == (-(-65536 // per), per)  # 263 splits of 249 rows


def test_a_softmax_over_columns_runs_its_max_then_its_sum_then_the_division(torch_kernels):
    """A column kernel's results exist only after its second launch, so a reduction inside
    another's argument runs first, on its own (``expr.split_at_reductions``)."""
    jfn, _ = check_vs_eager(lambda x: torch.softmax(x, 0), _r(4096, 64))
    parts = [(part.prog.family, part.geo.columns) for _, k in _kernels(jfn) for part in k.parts]
    assert parts == [("rows", True), ("rows", True), ("pointwise", False)]


def test_an_in_place_update_of_a_tensor_this_segment_updated_writes_it_once(torch_kernels):
    """``x[1:3] = 0.5`` copies a new tensor into x, then ``x.add_`` writes into that copy's
    result, an alias of x: one store into x, of the later value (the random in-place
    programs found the second store looking for the alias as a tensor of its own, and
    falling back with a KeyError)."""

    def f(x):
        x[1:3] = 0.5
        x.add_(0.5)
        return x * 1.0

    jfn, _ = check_vs_eager(f, _r(4, 6))
    assert all(k for _, k in _kernels(jfn)) and not any(p.decision.fallbacks for p in _plans(jfn))


def test_an_in_place_write_into_a_returned_temporary_is_its_value_and_runs_a_kernel(torch_kernels):
    """``t0 = x * x; t0.add_(0.5); return t0``: no tensor holds t0 inside the segment, so a
    kernel had nothing to write into and the segment ran on the reference backend (before
    that, a KeyError). The region made t0 and nothing else sees its memory, so the write is
    elided and the region returns the added value itself (an optimizer's bias corrections:
    ``torch._foreach_sqrt_`` of a fresh ``_foreach_pow`` list)."""

    def f(x):
        t0 = x * x
        t0.add_(0.5)
        return t0

    jfn, _ = check_vs_eager(f, _r(4, 6))
    assert "write of t1 into t0 elided" in explain(jfn)
    assert all(k for _, k in _kernels(jfn)) and not any(p.decision.fallbacks for p in _plans(jfn))


def test_a_row_reduction_gathers_an_operand_strided_along_the_row(torch_kernels):
    """x is row-major and y.t() column-major, so the reduced dim is innermost for one and
    outermost for the other. Over 64 rows y.t() is copied into the rows' order first,
    through shared-memory tiles (``expr.transpose_first``); over fewer rows than a tile
    fills, one row kernel reads y.t() element by element (4.3x faster than the reference
    backend for a bf16 softmax on the H100, scripts/gather_rows_probe.py)."""

    def parts(jfn):
        return [(part.prog.family, part.geo.stage) for kind, k in _kernels(jfn) if k for part in k.parts]

    jfn, _ = check_vs_eager(lambda x, y: torch.softmax(x + y.t(), -1), _r(64, 96), _r(96, 64))
    assert parts(jfn) == [("pointwise", (0, (0,))), ("rows", ())]
    assert ("segment 0 copies y through shared-memory tiles into the order of its reduction's rows (a tiled "
            "transpose), then reduces reading the copy in vectors") in explain(jfn)
    jfn, _ = check_vs_eager(lambda x, y: (x * y.t()).sum(-1), _r(2, 64, 96), _r(96, 64))  # broadcast: not copied
    assert parts(jfn) == [("rows", ())]
    short = pointwise_geometry.STAGE_MIN_ROWS - 1
    jfn, _ = check_vs_eager(lambda x, y: torch.softmax(x + y.t(), -1), _r(short, 96), _r(96, short))
    assert parts(jfn) == [("rows", ())] and "shared-memory" not in explain(jfn)


IN_THE_ROW_KERNEL = "takes its sums per column in its row kernel"
APART = "takes its sums per column in a reduction of their own after its rows"


@pytest.mark.parametrize("shape, dtype, expect", [
    ((37, 1000), torch.float32, IN_THE_ROW_KERNEL),  # a block of 64 threads per row
    ((2, 19, 256), torch.bfloat16, IN_THE_ROW_KERNEL),  # rows of one warp, 4 per block (the last block ragged)
    ((8, 16384), torch.bfloat16, IN_THE_ROW_KERNEL),  # 512 threads of 4 vectors: 64 registers for the two sums
    ((8, 20480), torch.bfloat16, APART + " (its sums per column would hold 80 fp32 registers per thread (at most 64))"),
    ((3, 30000), torch.float32, APART + " (its rows are too long for registers)"),
])
def test_sums_per_column_run_in_the_row_kernel_or_apart(shape, dtype, expect, torch_kernels):
    """A norm backward's weight and bias gradients (sums over the rows) ride in the row kernel
    of its input gradient, or, where that kernel cannot hold them, run as a reduction of
    their own; explain() says which and why. Either way the results are right."""
    jfn = check_norm_backward(shape, dtype, "cpu", expect)
    parts = [part for _, k in _kernels(jfn) for part in k.parts]
    if expect == IN_THE_ROW_KERNEL:
        (part,) = parts
        assert part.geo.across and part.workspace == (part.geo.splits[0], 2 * shape[-1])
    else:
        assert [(p.prog.family, p.geo.across) for p in parts][-1] == ("rows", False) and len(parts) >= 2


@pytest.mark.parametrize("name", ["layer norm of an fp32 copy, weight cast", "norm backward"])
def test_a_square_domain_tells_a_weight_from_a_row_statistic(name, torch_kernels):
    """Where the rows are as long as there are rows, a weight ([n]) has the shape of a value
    per row. A cast of one, broadcast along the rows, was lowered as a value per row
    (a wrong result, 13 off, before session 17): an op over inputs alone is pushed to its
    loads, whose broadcast says what each is."""
    x, w = _r(64, 64, dtype=torch.bfloat16), _r(64, dtype=torch.bfloat16)
    if name == "norm backward":
        check_vs_float64(norm_backward, *norm_backward_args((64, 64), torch.bfloat16))
    else:
        check_vs_eager(lambda x, w: torch.nn.functional.layer_norm(x.float(), (64,), w.float()).to(x.dtype), x, w)


def test_sums_per_column_run_apart_where_the_rows_are_not_innermost(torch_kernels):
    jfn = check_norm_backward((64, 96), torch.float32, "cpu", APART + " (its rows do not run as one row kernel: a column reduction", transposed=True)
    assert not any(part.geo.across for _, k in _kernels(jfn) for part in k.parts)


def test_a_sum_over_the_rows_met_before_the_row_sum_keeps_a_segment_of_its_own(torch_kernels):
    """The segmenter cannot tell a row from a column: a sum per column joins a segment whose
    rows end at the last dim, and only after its row sum (a column sum met first would
    otherwise take the rows in as sums per column). The bias gradient, met first, keeps a
    segment of its own; the weight gradient, met after the row sum, is taken per column
    beside it (once the casts and broadcasts of the inputs no longer placed it with the
    bias gradient: ``segmenter._floats``)."""

    def columns_first(x, w, g, rstd):
        db = g.sum(0)
        dx, dw, _ = norm_backward(x, w, g, rstd)
        return dx, dw, db

    jfn, _ = check_vs_float64(columns_first, *norm_backward_args((16, 64)))
    segs = [s.describe() for r in _fusions_of(jfn) for s in r.segments]
    assert segs == ["reduction: sum over dims (0,)", "normalization: sum over dims (1,), sum over dims (0,) per column"], segs


def _fusions_of(jfn):
    from thunder_fuser.inspect.explain import _fusions

    return list(_fusions(thunder.last_traces(jfn)[-1]))


# ---- PTX on the CPU machine ----------------------------------------------------------------

def _global_accesses(ptx: str) -> list:
    """A kernel's global loads and stores in order (a failed count's message)."""
    return re.findall(r"[ls][dt]\.global[.\w]*", ptx)


def _rope_args(batch, dtype):
    """q, k (32 and 8 heads of 64 positions), cos, sin."""
    return (_r(batch, 32, 64, 128, dtype=dtype), _r(batch, 8, 64, 128, dtype=dtype),
            _r(64, 128, dtype=dtype), _r(64, 128, dtype=dtype))


def _two_level(name: str):
    """(fn, make) of one of ``TWO_LEVEL_RESIZES``."""
    fn, shapes = TWO_LEVEL_RESIZES[name]
    return fn, lambda: [_r(*s) for s in shapes]


FAMILIES = {
    "pointwise bf16 with broadcast": (gelu_bias, lambda: (_r(33, 4096, dtype=torch.bfloat16), _r(4096, dtype=torch.bfloat16))),
    "pointwise ragged 1-D": (lambda a: torch.exp(a) * 2, lambda: (_r(4097),)),
    "pointwise gather (transposed input, contiguous along a dim too short to stage)": (
        lambda a, b: b * a, lambda: (_r(40, 8).t(), _r(8, 40))
    ),
    "pointwise staged through shared memory (a tiled transpose; bf16, 3-D, ragged tiles)": (
        lambda a, b: a * b.transpose(1, 2), lambda: (_r(3, 40, 72, dtype=torch.bfloat16), _r(3, 72, 40, dtype=torch.bfloat16))
    ),
    "reduction": (lambda x: x.amax(-1), lambda: (_r(37, 1000),)),
    "normalization, rows of one warp (softmax fp32, 128 wide)": (softmax, lambda: (_r(37, 128),)),
    "normalization (softmax)": (softmax, lambda: (_r(37, 1000),)),
    "normalization (layernorm, block reduction)": (layernorm, lambda: (_r(8, 4096), _r(4096), _r(4096))),
    "pointwise, broadcast operands read once for 2 rows (RoPE's cos and sin)": (rope, lambda: _rope_args(2, torch.bfloat16)),
    "resize (rotate-half + residual)": (rotate_half_residual, lambda: (_r(2, 4, 33, 128, dtype=torch.bfloat16),)),
    "copy_to_out_ (in-place Adam)": (adam_step, lambda: tuple([_r(4096)] for _ in range(4))),
    "column reduction (#785 bias gradient)": (
        gelu_bias_backward, lambda: (_r(2, 16, 256), _r(2, 16, 256), _r(2, 16, 256), *GELU_SCALARS)
    ),
    "column reductions (sum, amax, amin, mean, prod, var; bf16)": (
        lambda x: (x.sum(0), x.amax(0), x.amin(0), x.mean(0), x.prod(0), x.var(0)),
        lambda: (_r(64, 1000, dtype=torch.bfloat16),),
    ),
    "normalization, row too long for registers (softmax, looped passes)": (softmax, lambda: (_r(2, 70000),)),
    "normalization, row too long for registers (log_softmax of bf16: max and sum in one pass)": (
        lambda x: torch.log_softmax(x.float(), -1),
        lambda: (_r(80, 30000, dtype=torch.bfloat16),)  # too many rows to split across blocks
    ),
    "normalization, rows of odd length too long for registers (log_softmax of bf16 over the rows' flat vectors)": (
        lambda x: torch.log_softmax(x.float(), -1),
        lambda: (_r(81, 50257, dtype=torch.bfloat16),)  # 81 * 50257 elements: the last vector is partial
    ),
    "normalization, rows of odd length in registers (layer_norm of bf16 over the rows' flat vectors, its weight element by element)": (
        lambda x, w: torch.nn.functional.layer_norm(x, (4097,), w),
        lambda: (_r(33, 4097, dtype=torch.bfloat16), _r(4097, dtype=torch.bfloat16)),
    ),
    "pointwise over a flat run (gelu(x + bias) of bf16 rows of odd length: x and the output in whole vectors)": (
        gelu_bias, lambda: (_r(33, 4097, dtype=torch.bfloat16), _r(4097, dtype=torch.bfloat16))
    ),
    "row reductions (amin, var, prod)": (lambda x: (x.amin(-1), x.var(-1), x.prod(-1)), lambda: (_r(37, 1000),)),
    "normalization gathering an operand strided along the row (layernorm of x * y.t() over 8 rows)": (
        lambda x, y: torch.nn.functional.layer_norm(x * y.t(), (96,)), lambda: (_r(8, 96), _r(96, 8)),
    ),
    "normalization reading an operand transposed first (softmax of x + y.t(): a staged copy, then rows; bf16)": (
        lambda x, y: torch.softmax(x + y.t(), -1), lambda: (_r(64, 96, dtype=torch.bfloat16), _r(96, 64, dtype=torch.bfloat16)),
    ),
    "normalization over columns (channels-last batch norm: stats, then apply)": (
        lambda x, w, b: torch.nn.functional.batch_norm(x, None, None, w, b, training=True),
        lambda: (_r(8, 16, 10, 10, dtype=torch.bfloat16).to(memory_format=torch.channels_last),
                 _r(16, dtype=torch.bfloat16), _r(16, dtype=torch.bfloat16)),
    ),
    "resize, pad of H and W (a select along an outer dim and one along the vector dim)": _two_level("pad of H and W (NCHW)"),
    "resize, pad of a cat (nested selects along one dim)": _two_level("pad of a cat"),
    "resize, q/k/v gradients concatenated first, cast and scaled by a row before the merge (bf16)": (
        lambda dq, dk, dv, w: _qkv_gradient_cat(dq, dk, dv).float() * w,
        lambda: tuple(_r(*s, dtype=torch.bfloat16) for s in ((2, 4, 16, 64), (2, 4, 64, 16), (2, 4, 16, 64), (768,)))
    ),
    "normalization over a causal iota mask (int64 iotas computed from indices, bool logic and stores; bf16)": (
        CREATION_CASES["causal mask from arange (softmax; the mask and its negation returned)"][0],
        lambda: (_r(2, 4, 100, 100, dtype=torch.bfloat16),),
    ),
    "pointwise bool and constant stores": (
        CREATION_CASES["bool and constant outputs (where, zeros_like + 1, full_like, arange)"][0], lambda: (_r(33, 1000),)
    ),
    "pointwise integer division (truncating and floor, int64)": (
        integer_division, lambda: signed_operands((33, 257), torch.int64)
    ),
    "split rows (few long rows: a whole-tensor sum, amax and var beside a full-domain store)": (
        lambda x: (x.sum(), x.amax(), x.var(), x * 2), lambda: (_r(2**20),)
    ),
    "split rows (a layer norm of 4 long rows: statistics split, then pointwise; bf16)": (
        lambda x: torch.nn.functional.layer_norm(x, (2**18,)), lambda: (_r(4, 2**18, dtype=torch.bfloat16),)
    ),
    "split rows (a softmax of one long row: its max, its sum, then the division)": (
        softmax, lambda: (_r(1, 2**18),)
    ),
    "column reductions chained (a softmax over columns: its max, its sum, then the division; bf16)": (
        lambda x: torch.softmax(x, 0), lambda: (_r(4096, 64, dtype=torch.bfloat16),)
    ),
    "pointwise ragged 1-D bool mask (its tail read element by element)": (
        lambda m, x: torch.where(m, 2.0, x), lambda: (_r(4097) > 0, _r(4097))
    ),
    "where over every mix of vectors, row values and constants (log_softmax, logsumexp; bf16)": (
        lambda x: (torch.log_softmax(x.float(), -1), torch.logsumexp(x.float(), -1), torch.where(x > 0, 1.0, -0.5),
                   torch.where(x.amax(-1, keepdim=True) > 0, x, 0.0), torch.where(x.sum(-1, keepdim=True) > 0, 1.0, 2.0) * x),
        lambda: (_r(37, 1000, dtype=torch.bfloat16),)
    ),
    "reduction in two stages (var_mean over N, H and W of NCHW: partials over H and W, then over N; bf16)": (
        lambda x: torch.var_mean(x, dim=(0, 2, 3)), lambda: (_r(6, 8, 7, 9, dtype=torch.bfloat16),)
    ),
    "normalization with sums per column (a norm backward's weight and bias gradients in its row kernel; bf16)": (
        norm_backward, lambda: norm_backward_args((2, 19, 256), torch.bfloat16)
    ),
    "resize along an outer dim (cat, bf16)": (
        lambda x, y: torch.cat((x, y * 2), 1), lambda: (_r(2, 3, 64, dtype=torch.bfloat16), _r(2, 5, 64, dtype=torch.bfloat16))
    ),
}


@pytest.mark.parametrize("name", FAMILIES)
def test_fake_tensors_agree_with_the_views_a_call_passes(name):
    """TVM-FFI checks every call against the compiled signature: a static extent or stride
    must equal the view's, one symbol shared by two operands must stand for equal extents,
    and a symbol's divisibility must hold. A mismatch only shows at the first launch on a GPU."""
    pytest.importorskip("cutlass")
    from cutlass.cute.typing import SymInt

    from thunder_fuser.backends.cute.dsl.cute_memory import fake_operands
    from thunder_fuser.backends.cute.tiling.base_maps import views_for_call

    fn, make = FAMILIES[name]
    for p in planned_parts(fn, make()):
        bound = {}
        for fake, o in zip(fake_operands(p.geo), views_for_call(p.geo, p.geo.bases)):
            if isinstance(o, tuple):  # a base passed beside its element offset (``BaseMap.offset``)
                (fake, fake_offset), (o, offset) = fake, o
                assert isinstance(fake_offset, SymInt) and isinstance(offset, int), (name, fake_offset, offset)
            for fake_dims, real_dims in ((fake.shape, o.shape), (fake.stride, o.stride())):
                assert len(fake_dims) == len(real_dims), (name, fake, o)
                for f, r in zip(fake_dims, real_dims):
                    if isinstance(f, SymInt):
                        assert bound.setdefault(id(f), r) == r, (name, "one symbol, two extents", fake, o)
                        assert r % f.divisibility == 0, (name, fake, o)
                    else:
                        assert f == r, (name, fake, o)


def _base_map_cases():
    from thunder_fuser.backends.cute.tiling.base_maps import PRODUCT, BaseMap, Run

    q = torch.randn(2, 4, 16, 32)  # [batch, heads, positions, d]
    x = torch.randn(2, 16, 8)
    w = torch.randn(4, 6)
    merged = BaseMap((2, Run((0, 1), PRODUCT), 3))
    return {
        # positions, batch and heads merged, d: a run of two base dims
        "heads merged with the batch": (q, q.as_strided((16, 8, 32), (32, 512, 1)), None, merged),
        # q's second half: a slice of d to a piece's static extent, at an offset
        "second half of the last dim": (q, q.as_strided((16, 8, 16), (32, 512, 1), 16), None,
                                        BaseMap((2, Run((0, 1), PRODUCT), Run((3,), 16)), True)),
        # x[:, 4:8] with its window and last dim merged: the run's outermost dim sliced, the
        # extent the reference operand's
        "a window merged with the row": (x, x[:, 4:8].as_strided((2, 32), (128, 1), 32), (2, 32),
                                         BaseMap((0, Run((1, 2), None)), True)),
        # every dim merged into one: a batch of 1 joins the run as a batch of 3 does, so
        # both take one kernel
        "a batch of 1, flattened": (x[:1], x[:1].as_strided((128,), (1,)), None, BaseMap((Run((0, 1, 2), PRODUCT),))),
        "a batch of 2, flattened": (x, x.as_strided((256,), (1,)), None, BaseMap((Run((0, 1, 2), PRODUCT),))),
        # rows of 12 stepping over w's rows two at a time: no run of w's dims
        "dims that do not nest": (w, w.as_strided((2, 12), (12, 1)), None, None),
    }


@pytest.mark.parametrize("case", list(_base_map_cases()))
def test_base_maps_describe_merges_and_slices_of_the_base(case):
    """``base_maps.mode_map``: what the launch function builds from a base tensor instead
    of an ``as_strided`` per call, and that rebuilding it from the base gives the view."""
    from thunder_fuser.backends.cute import torch_eval
    from thunder_fuser.backends.cute.tiling.base_maps import mode_map
    from thunder_fuser.backends.cute.tiling.operands import Geometry, Operand

    base, view, ref_shape, expect = _base_map_cases()[case]

    o = Operand(0, tuple(view.shape), view.stride(), view.storage_offset() - base.storage_offset(), False, view.dtype)
    ref = None if ref_shape is None else Operand(1, ref_shape, (ref_shape[1], 1), 0, True, view.dtype)
    m = mode_map(o, base, ref)
    assert m == expect, m
    if m is None:
        return
    geo = Geometry([o, ref] if ref else [o], {}, [1] if ref else [0], (), 0, 1, False)
    geo.base_maps, geo.map_ref = ((m, None) if ref else (m,)), 1 if ref else 0
    passed = [(base, o.offset) if m.offset else base] + ([torch.empty(ref_shape)] if ref else [])
    built = torch_eval.from_bases(geo, passed)[0]
    assert (built.shape, built.stride(), built.storage_offset()) == (view.shape, view.stride(), view.storage_offset())


@pytest.mark.parametrize("name", BOOL_STORES)
def test_a_bool_is_stored_as_torchs_byte_1_by_every_family(name, ptx_compile):
    """CuTe DSL stores its Boolean as the sign extension of an i1 (the byte 0xFF); torch's
    true is the byte 1. A 0xFF that torch reads counts 255 in ``.sum()``, and one a later
    kernel reads as a row's scalar converts to -1.0: on two GPUs, FSDP's loss (a mask that
    one region wrote, another read) came out negated. In the PTX, no ``selp -1, 0`` (the
    sign-extended true) may reach a byte packed for a store."""
    from thunder_fuser.backends.cute import cache

    cache.clear_memory()
    fn, make = BOOL_STORES[name]
    ptx = "".join(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)) for p in planned_parts(fn, make()))
    minus_one = set(re.findall(r"selp\.b\d+\s+(%r\d+), -1, 0", ptx))
    packed = set(re.findall(r"(?:prmt\.b32|cvt\.u8\.u32|st\.global\.[.\w]+)\s+[^;]*?(%r\d+)[,;\]} ]", ptx))
    packed |= {r for line in re.findall(r"(?:prmt\.b32|st\.global[.\w]*)\s+([^;]*);", ptx) for r in re.findall(r"%r\d+", line)}
    assert not minus_one & packed, sorted(minus_one & packed)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_compiles_to_ptx_without_a_gpu(name, ptx_compile, tmp_path):
    from thunder_fuser.backends.cute import cache

    cache.clear_memory()
    fn, make = FAMILIES[name]
    parts = planned_parts(fn, make())
    assert parts
    ptx = "".join(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)) for p in parts)
    assert ".target sm_90a" in ptx
    if name.startswith("pointwise bf16"):
        assert "ld.global.v4" in ptx and "st.global.v4" in ptx  # 128-bit accesses
    if name == "pointwise ragged 1-D":  # the tail vector element by element: 4 scalar loads and stores
        assert ptx.count("ld.global.b32") == 4 and ptx.count("st.global.b32") == 4, ptx
    if name.startswith("resize, pad of H and W"):  # pieces shifted along two dims still move whole vectors
        assert "ld.global.v4" in ptx and "st.global.v4" in ptx
    if name.startswith("normalization over a causal"):  # the iotas are computed from indices, never loaded
        assert not re.search(r"ld\.global[.\w]*\.[bsu]64", ptx), re.findall(r"ld\.global[.\w]*", ptx)
    if name.startswith(("normalization (softmax)", "normalization over a causal")):
        # one reciprocal of the row's sum, no division per element (whose slow path a zero
        # numerator takes: the masked half of a causal row)
        assert "rcp.rn.f32" in ptx and "div.rn.f32" not in ptx, re.findall(r"(?:div|rcp)\.[\w.]+", ptx)
    if name.startswith("normalization, row too long for registers (log_softmax"):
        # the max and the sum of exp(x - max) in one pass (online softmax), then the stores:
        # two passes of loads, not three. The fp32 results move in 16-byte vectors of 4
        # (``geometry.vector_width``), so x in 8-byte ones, twice as many per loop step
        # (``cute_memory.unroll``); the last pass's stores stream. Each pass's loop step is
        # emitted twice: unmasked for the steps inside the row, masked for the one after them
        # (LLVM may unroll a loop further: at least that many)
        from thunder_fuser.backends.cute.dsl.cute_memory import LOOP_UNROLL, unroll

        (p,) = parts
        u = unroll(p.geo)
        assert p.geo.vector == 4 and u == 2 * LOOP_UNROLL and _passes(ptx) == 2
        assert ptx.count("ld.global.v4.b16") >= 2 * 2 * u and ptx.count("st.global.cs.v4.b32") >= 2 * u, \
            _global_accesses(ptx)
        assert "st.global.v4" not in ptx
    if name.startswith("normalization, rows of odd length too long"):
        # both passes load whole vectors, and the last stores them; each pass's edge vector,
        # shared with a neighbouring row, moves element by element (the loop steps twice
        # over, as above)
        from thunder_fuser.backends.cute.dsl.cute_memory import unroll

        (p,) = parts
        u, v = unroll(p.geo), p.geo.vector
        assert _passes(ptx) == 2
        assert ptx.count("ld.global.v4.b16") >= 2 * 2 * u and ptx.count("st.global.cs.v4.b32") >= 2 * u, \
            _global_accesses(ptx)
        assert ptx.count("ld.global.b16") == 2 * v and ptx.count("st.global.b32") == v, _global_accesses(ptx)
    if name.startswith("normalization, rows of odd length in registers"):
        # x in whole vectors, row_vectors of them per thread, and its outputs so; the weight
        # element by element in every vector; the two edge vectors' 16 elements one per
        # thread (x's and the weight's, and the output's)
        (p,) = parts
        k = p.geo.row_vectors
        assert p.geo.row_threads >= 16
        assert ptx.count("ld.global.v4") == k and ptx.count("st.global.v4") == k, _global_accesses(ptx)
        assert ptx.count("ld.global.b16") == 8 * k + 2 and ptx.count("st.global.b16") == 1, _global_accesses(ptx)
    if name.startswith("column reduction (#785"):
        # the finalize's lanes take consecutive columns (a split's loads coalesce) and its
        # groups of lanes merge: shuffles across groups only, then shared memory across warps
        from thunder_fuser.backends.cute.families.partials import FINALIZE_COLUMNS

        finalize = ptx[re.search(r"\.entry \w*kernel_cutlass_finalize", ptx).start():]
        offsets = [int(k) for k in re.findall(r"shfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, (\d+),", finalize)]
        assert sorted(offsets) == [1 << k for k in range(FINALIZE_COLUMNS.bit_length() - 1, 5)], offsets
        assert "bar.sync" in finalize and "st.shared" in finalize
    if name.startswith("pointwise over a flat run"):
        # one vector of x, the bias element by element: once for a vector inside its row, once
        # for one that reaches into the next (``_flat_pointwise_pieces``)
        assert ptx.count("ld.global.v4") == 2 and ptx.count("st.global.v4") == 2, _global_accesses(ptx)
    if name.startswith("pointwise staged"):  # scalar reads along the operand's rows, 128-bit stores
        assert "st.shared" in ptx and "bar.sync" in ptx and "st.global.v4" in ptx, ptx
    if name.startswith("pointwise gather"):
        assert "bar.sync" not in ptx
    if name.startswith("pointwise, broadcast"):  # per row: q, two rotate-half pieces, and half of cos and sin
        assert ptx.count("ld.global.v4") < 5 * ptx.count("st.global.v4"), ptx.count("ld.global.v4")
    assert list((tmp_path / "cache").rglob("*.o")), "the compiled kernel is exported to the disk cache"


def _passes(ptx: str) -> int:
    """The passes of a looped row kernel over its row: the stretches of vector loads between
    its block reductions' barriers."""
    return sum(1 for stretch in ptx.split("bar.sync") if "ld.global.v4" in stretch)


def test_a_looped_rows_last_pass_streams_its_stores_and_marks_its_last_reads(ptx_compile):
    """A row too long for registers is re-read by its last pass, which stores the results:
    those stores stream (st.global.cs), and from ``rows_geometry.LOOP_LAST_USE_BYTES`` of row on
    its reads of the row are marked last use (ld.global.lu), but never those of an operand
    every row reads (the weight), so that the L2 keeps the rows other blocks have yet to
    re-read; there the passes before it load x with an L2 evict-last policy (the lines the
    last pass reads again), and elsewhere plainly."""
    from thunder_fuser.backends.cute.dsl.cute_memory import LOOP_UNROLL

    def part(n):  # only x's bytes count towards the threshold, not the weight's
        fn = lambda x, w: torch.nn.functional.layer_norm(x, (n,), w)
        (p,) = planned_parts(fn, (_r(80, n, dtype=torch.bfloat16), _r(n, dtype=torch.bfloat16)))
        assert p.geo.looped and p.geo.last_use == (2 * n >= rows_geometry.LOOP_LAST_USE_BYTES)
        return p

    def ptx(n):
        p = part(n)
        return ptx_text(segment_kernel.compile_program(p.prog, p.geo, None))

    part(40000)  # 78 KiB of x, 156 with the weight's: no last use
    long, short = ptx(rows_geometry.LOOP_LAST_USE_BYTES // 2), ptx(30000)  # rows of 128 and 59 KiB
    # the last pass's loads of x (its step twice: unmasked inside the row, masked after it)
    # are the row's last use; the mean's and the var's keep their lines in L2, and the
    # weight's loads stay plain (LLVM may unroll the first passes' loops further: count the
    # difference)
    u = 2 * LOOP_UNROLL
    kept = long.count("ld.global.L2::cache_hint.v4")
    assert long.count("ld.global.lu.v4") == u and short.count("ld.global.lu") == 0
    assert kept >= 2 * u and "cache_hint" not in short
    assert short.count("ld.global.v4") - long.count("ld.global.v4") == u + kept
    for text in (long, short):
        assert text.count("st.global.cs.v4") == u and "st.global.v4" not in text


def _checked_geometry(fn, *args):
    """The geometry of ``fn``'s one kernel part, once its results on the reference backend
    matched eager."""
    check_vs_eager(fn, *args)
    (p,) = planned_parts(fn, args)
    return p.geo


def test_rows_of_odd_length_walk_whole_vectors_where_the_rows_lie_back_to_back(torch_kernels):
    """A row of odd length starts 16 bytes apart from the last only every 8th row, so its
    kernel had loaded element by element. Where every operand written along the rows holds
    them back to back, a row kernel, looped or holding its row in registers, takes the whole
    vectors of that flat run instead (``geometry.flat_rows``), with the row's two edge
    vectors element by element; a weight every row reads along the row (the row's shift
    misaligns it) is read element by element. A slice of wider rows, a misaligned first
    element and a row kernel that also sums per column keep vectors of one element, and so
    do rows in registers too short to repay the edge vectors.
    Results on the reference backend; the kernels' on the GPU (test_cuda_kernels.py)."""
    F = torch.nn.functional
    bf = torch.bfloat16
    log_softmax = lambda x: torch.log_softmax(x.float(), -1)

    def walk(fn, *args):
        geo = _checked_geometry(fn, *args)
        assert geo.row_threads and not geo.split_rows
        return geo.flat, geo.vector, "looped" if geo.looped else geo.row_vectors

    # fp32 results of bf16 rows: vectors of 4, whose stores move 16 bytes (``geometry.vector_width``)
    assert walk(log_softmax, _r(81, 50257, dtype=bf)) == (True, 4, "looped")
    assert walk(lambda x: torch.logsumexp(x.float(), -1), _r(81, 50257, dtype=bf)) == (True, 8, "looped")  # row values stored
    assert walk(lambda x: F.layer_norm(x, (30001,)), _r(80, 30001, dtype=bf)) == (True, 8, "looped")
    assert walk(lambda x: torch.softmax(x, -1), _r(80, 30001)) == (True, 4, "looped")
    assert walk(lambda y, g: y * (g - (g * y).sum(-1, keepdim=True)), _r(80, 30001), _r(80, 30001)) == (True, 4, "looped")
    assert walk(lambda x, w: F.layer_norm(x, (30001,), w), _r(80, 30001, dtype=bf), _r(30001, dtype=bf)) == (True, 8, "looped")
    # rows in registers: the tiling counts the middle's whole vectors (at most 511 of 8 over
    # 128 threads: 4 each); the edge vectors ride apart
    assert walk(lambda x: torch.softmax(x, -1), _r(64, 4097, dtype=bf)) == (True, 8, 4)
    assert walk(lambda x, w, b: F.layer_norm(x, (4097,), w, b), _r(33, 4097, dtype=bf), _r(4097, dtype=bf),
                _r(4097, dtype=bf)) == (True, 8, 4)
    assert walk(lambda x: torch.softmax(x.float() * 0.125, -1), _r(3, 5, 197, dtype=bf)) == (True, 4, 3)  # ViT's 197 tokens
    assert walk(lambda x: torch.softmax(x, -1), _r(100, 97, dtype=bf)) == (True, 8, 3)  # over 4 threads
    # in vectors of one element a row of 16385 did not fit registers (8 per thread at most); flat it does
    assert walk(lambda x: torch.softmax(x, -1), _r(200, 16385, dtype=bf)) == (True, 8, 4)
    # rows of fewer than FLAT_MIN_VECTORS vectors do not repay their edge elements
    assert walk(lambda x: torch.softmax(x, -1), _r(100, 33, dtype=bf)) == (True, 8, 1)
    assert walk(lambda x: torch.softmax(x, -1), _r(100, 8 * rows_geometry.FLAT_MIN_VECTORS - 1, dtype=bf))[:2] == (False, 1)
    assert walk(lambda x: torch.softmax(x.float(), -1), _r(100, 4 * rows_geometry.FLAT_MIN_VECTORS, dtype=bf)[:, 1:])[:2] == (
        False, 1)
    assert walk(lambda x: torch.softmax(x.float(), -1), _r(100, 77, dtype=bf))[:2] == (True, 4)
    assert walk(lambda x: torch.logsumexp(x.float(), -1), _r(100, 33, dtype=bf))[:2] == (True, 8)  # row values only
    assert walk(log_softmax, _r(80, 30008, dtype=bf)[:, :30001])[:2] == (False, 1)
    assert walk(log_softmax, _r(81, 30001, dtype=bf)[1:])[:2] == (False, 1)
    assert walk(log_softmax, _r(80, 30000, dtype=bf)) == (False, 4, "looped")  # rows of whole vectors: not flat
    assert _checked_geometry(norm_backward, *norm_backward_args((37, 1001))).flat is False  # sums per column


def test_short_rows_take_a_part_of_a_warp(torch_kernels):
    """A row held in registers takes the fewest threads whose vectors fit it
    (``rows_geometry.ROW_THREADS``), down to 4, so that a short row keeps its threads' loads
    several and a warp's rows many; more than 4 vectors per thread only where they are
    vectors of one element (``rows_geometry.ROW_ELEMENTS``) or the block has
    ``rows_geometry.WIDE_ROW_THREADS`` threads, and there only where a block twice as wide would
    hold more than ``rows_geometry.PAIRED_BLOCK_ELEMENTS`` elements per thread."""
    bf = torch.bfloat16

    def tiling(fn, *args):
        geo = _checked_geometry(fn, *args)
        return geo.row_threads, geo.row_vectors, geo.vector

    softmax = lambda x: torch.softmax(x, -1)
    assert tiling(softmax, _r(300, 64, dtype=bf)) == (4, 2, 8)
    assert tiling(softmax, _r(300, 256, dtype=bf)) == (8, 4, 8)
    assert tiling(softmax, _r(300, 128)) == (8, 4, 4)  # fp32: not 4 threads of 8 vectors
    assert tiling(softmax, _r(300, 77, dtype=bf)) == (4, 3, 8)  # odd: the flat run's middle, 9 vectors at most
    # odd and stored in fp32: the flat run's middle in vectors of 4, 16-byte stores (18 vectors at most)
    assert tiling(lambda x: torch.softmax(x.float(), -1), _r(300, 77, dtype=bf)) == (8, 3, 4)
    assert tiling(lambda x, w: torch.nn.functional.rms_norm(x, (4096,), w), _r(30, 4096, dtype=bf),
                  _r(4096, dtype=bf)) == (128, 4, 8)
    assert tiling(softmax, _r(300, 16384, dtype=bf)) == (512, 4, 8)  # not 256 threads of 8 vectors
    assert tiling(softmax, _r(300, 20000, dtype=bf)) == (512, 5, 8)  # 2500 vectors: 1024 threads would hold 24 elements
    # 4096 vectors of 4: 1024 threads hold 16 elements each (PAIRED_BLOCK_ELEMENTS), not 512 threads 32
    assert tiling(lambda x: torch.log_softmax(x.float(), -1), _r(30, 16384, dtype=bf)) == (1024, 4, 4)
    assert tiling(softmax, _r(30, 16384)) == (1024, 4, 4)
    assert tiling(softmax, _r(30, 20000)) == (1024, 5, 4)  # 512 threads would hold 10 vectors


def test_pointwise_over_rows_of_odd_length_moves_whole_vectors_where_they_lie_back_to_back(torch_kernels):
    """A pointwise kernel whose rows of odd length cannot merge into one dim (a bias along
    them, a value per row) computes vectors of the rows' flat run, which may span two rows
    (``geometry.flat_rows``, Inductor's flat index); the operands not laid out so are read
    element by element, and need no alignment (``vector_access``). Not over rows shorter
    than a vector, nor with an operand strided along N (a transposed one is staged)."""
    bf = torch.bfloat16

    def walk(fn, *args):
        geo = _checked_geometry(fn, *args)
        return geo.flat, geo.vector, len(geo.align_checks)

    bias = _r(4098, dtype=bf)[1:]  # misaligned: read element by element
    assert walk(gelu_bias, _r(33, 4097, dtype=bf), bias) == (True, 8, 2)  # x and the output
    assert walk(lambda x, s, b: x * s + b, _r(7, 5, 4099), _r(7, 5, 1), _r(4099)) == (True, 4, 2)
    # a bool mask, vectors span rows; fp32 stores: vectors of 4 (``geometry.vector_width``)
    assert walk(lambda m, x: torch.where(m, x, 0.0), _r(1001, 9) > 0, _r(9)) == (True, 4, 2)
    assert walk(lambda x, b: x + b, _r(1001, 9, dtype=bf), _r(9, dtype=bf)) == (True, 8, 2)  # vectors span rows
    assert walk(lambda x, b: x + b, _r(64, 5, dtype=bf), _r(5, dtype=bf))[0] is False  # rows shorter than a vector
    assert walk(lambda x, y: x + y.t(), _r(64, 4097, dtype=bf), _r(4097, 64, dtype=bf))[0] is False


def test_a_looped_row_read_once_takes_the_narrowest_block(torch_kernels):
    """The L2 rule (``rows_geometry.LOOP_L2_BYTES``) sizes the blocks of a looped row whose passes
    re-read it; a row read once (a logsumexp's max and sum taken online, one sum; only row
    values stored: ``expr.reads_rows_once``) takes the narrowest block of LOOP_THREADS."""
    x = _r(80, 128256, dtype=torch.bfloat16)

    def threads(fn):
        geo = _checked_geometry(fn, x)
        assert geo.looped
        return geo.row_threads

    narrow, wide = rows_geometry.LOOP_THREADS[0], rows_geometry.LOOP_THREADS[-1]
    assert threads(lambda x: torch.logsumexp(x.float(), -1)) == narrow
    assert threads(lambda x: (x.float() * 2).sum(-1)) == narrow
    assert threads(lambda x: x.float().var(-1)) == wide  # the mean, then the squared deviations
    assert threads(lambda x: torch.log_softmax(x.float(), -1)) == wide  # the last pass re-reads the row


def test_only_a_tanh_rounded_to_bf16_at_once_uses_the_approximate_instruction(ptx_compile):
    """tanh.approx.f32 errs by up to 2**-10.9 relative: below half a bf16 ulp, not an fp32 one."""

    def ptx(fn, x):
        return "".join(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)) for p in planned_parts(fn, (x,)))

    assert "tanh.approx.f32" in ptx(lambda x: torch.tanh(x.float()).to(torch.bfloat16), _r(64, 256))
    assert "tanh.approx" not in ptx(torch.tanh, _r(64, 256))


def _backward_parts(fn, x):
    """The kernel parts of ``fn``'s backward (planned on the CPU, lowered through torch)."""
    os.environ["THUNDER_FUSER_KERNELS"] = "torch"
    try:
        jfn = thunder.jit(fn, executors=[fuser_ex])
        y = jfn(x.requires_grad_())
        y.backward(torch.randn_like(y))
    finally:
        del os.environ["THUNDER_FUSER_KERNELS"]
    return [part for p in plans(thunder.last_backward_traces(jfn)[-1]) for k in p.kernels.values() if k for part in k.parts]


def test_bf16_roundings_pack_two_lanes_or_compute_in_bf16(ptx_compile):
    """Eager rounds every op of a bf16 program, and so does thunder's trace. A rounding runs
    as the packed ``cvt.rn.bf16x2.f32`` (never one conversion per element: those share the
    quarter-rate pipe with tanh and exp), and an add or mul of bf16 values (or of constants
    exact in bf16) runs in bf16 itself, with no conversion; a product as ``fma.rn`` with
    -0.0, which ptxas cannot fuse into the add after it. The GELU backward (torch's, in
    fp32, rounded once) rounds in packed pairs too, and its tanh, used unrounded, is exact."""
    bf16 = _r(64, 4096, dtype=torch.bfloat16)
    parts = planned_parts(lambda x, y: torch.tanh(x * y + y) * x, (bf16, _r(64, 4096, dtype=torch.bfloat16)))
    ptx = "".join(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)) for p in parts)
    assert "cvt.rn.bf16.f32" not in ptx and "cvt.rn.bf16x2.f32" in ptx
    assert "fma.rn.bf16x2" in ptx and "add.bf16x2" in ptx and not re.search(r"\bmul(\.rn)?\.bf16x2", ptx)
    parts = _backward_parts(lambda x: torch.nn.functional.gelu(x, approximate="tanh"), bf16)
    ptx = "".join(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)) for p in parts)
    assert "cvt.rn.bf16.f32" not in ptx and "cvt.rn.bf16x2.f32" in ptx and "tanh.approx" not in ptx


def test_a_division_by_a_constant_multiplies_by_its_reciprocal(ptx_compile):
    """Eager CUDA divides by a scalar as a multiply by its fp32 reciprocal; so do the
    kernels (the exact GELU backward divides twice by sqrt(2) per element): no
    ``div.rn.f32``, whose dozen instructions and slow-path branch made it compute-bound. A
    division by a tensor stays a division."""
    parts = _backward_parts(torch.nn.functional.gelu, _r(64, 4096))
    ptx = "".join(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)) for p in parts)
    assert "ex2.approx" in ptx and "div.rn.f32" not in ptx  # the kernel (its exp) is there, no division
    (part,) = planned_parts(lambda a, b: a / b, (_r(64, 256), _r(64, 256)))
    assert "div.rn.f32" in ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))


def test_fp16_roundings_pack_two_lanes_too(ptx_compile):
    (part,) = planned_parts(lambda a, b: (a * 0.1 + b) * a, (_r(64, 256, dtype=torch.float16), _r(64, 256, dtype=torch.float16)))
    ptx = ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))
    assert "cvt.rn.f16x2.f32" in ptx and "cvt.rn.f16.f32" not in ptx and "fma.rn.f16x2" in ptx


def test_one_tensor_read_as_two_pieces_is_loaded_twice(ptx_compile):
    """``cat((x, x))``: both pieces view the same operand; each needs its own load (its own
    shift and predicate). A cache by operand alone loaded once and wrote zeros for the second."""
    (part,) = planned_parts(lambda x: torch.cat((x, x), -1) + 1, (_r(3, 64),))
    ptx = ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))
    assert ptx.count("ld.global") == 2 and ptx.count("st.global") == 1, ptx


GROUPS = {
    "RoPE's q and k": (rope, lambda dt: _rope_args(1, dt)),
    "three shapes and templates": (three_shapes, lambda dt: (_r(4097, dtype=dt), _r(33, 256, dtype=dt), _r(256, dtype=dt),
                                                              _r(5, 4097, dtype=dt), _r(3, 4097, dtype=dt))),
}


@pytest.mark.parametrize("name", GROUPS)
def test_independent_segments_share_one_launch(name, ptx_compile, torch_kernels):
    """Independent segments become one kernel (one PTX entry) whose blocks pick their
    program; on the torch backend the same group runs each program and matches eager."""
    fn, make = GROUPS[name]
    jfn, _ = check_vs_eager(fn, *make(torch.bfloat16))
    (plan,) = _plans(jfn)
    assert list(plan.groups) == [0] and plan.decision.apart == {}
    group = plan.groups[0]
    assert len(group.parts) == len(plan.decision.segments)
    ptx = ptx_text(segment_kernel.compile_group(group.parts, None))
    assert ptx.count(".entry") == 1
    one = sum(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)).count("st.global") for p in group.parts)
    assert ptx.count("st.global") == one  # every program's stores, in one kernel


def _foreach_adamw(ps, gs, ms, vs, steps):
    """torch's foreach AdamW as it runs compiled (``capturable``: the step counters 0-d
    tensors on the device)."""
    torch._foreach_add_(steps, 1)
    torch._foreach_mul_(ps, 1 - 1e-3 * 0.1)
    torch._foreach_lerp_(ms, gs, 0.1)
    torch._foreach_mul_(vs, 0.999)
    torch._foreach_addcmul_(vs, gs, gs, 0.001)
    b1 = torch._foreach_pow(0.9, steps)
    b2 = torch._foreach_pow(0.999, steps)
    torch._foreach_sub_(b1, 1)
    torch._foreach_sub_(b2, 1)
    torch._foreach_neg_(b2)
    torch._foreach_div_(b1, 1e-3)
    torch._foreach_reciprocal_(b1)
    torch._foreach_sqrt_(b2)
    denom = torch._foreach_sqrt(vs)
    torch._foreach_div_(denom, b2)
    torch._foreach_add_(denom, 1e-8)
    torch._foreach_div_(denom, b1)
    torch._foreach_addcdiv_(ps, ms, denom)


def test_an_optimizer_steps_updates_run_apart_and_share_launches(ptx_compile, torch_kernels):
    """Each parameter's update in place is a chain of its own (``segment/chains.py``): a
    segment each, never one kernel whose every thread runs every parameter's update; the
    updates (and the step counters') share one launch a step, each with blocks of its own."""
    shapes = ((64, 32), (32, 64), (2048,), (96,))

    def make():
        g = torch.Generator().manual_seed(0)
        t = lambda: [torch.randn(s, generator=g, dtype=torch.bfloat16) for s in shapes]  # noqa: E731
        return t(), t(), t(), [v.abs() for v in t()], [torch.tensor(float(i)) for i in range(len(shapes))]

    jfn, _ = check_vs_eager(_foreach_adamw, *make())
    (plan,) = _plans(jfn)
    assert len(plan.decision.segments) == 2 * len(shapes)  # each parameter's counter and its update
    assert all(len(seg.written_roots) <= 3 for seg in plan.decision.segments)
    groups = [g for g in plan.groups.values() if g is not None]
    assert plan.decision.apart == {} and sum(len(g.parts) for g in groups) == len(plan.decision.segments)
    for g in groups:
        ptx = ptx_text(segment_kernel.compile_group(g.parts, None))
        assert ptx.count(".entry") == 1


def test_a_misaligned_call_runs_a_shared_launch_apart(torch_kernels):
    check_a_misaligned_call_runs_a_shared_launch_apart(_r)


def test_a_group_that_cannot_share_a_launch_runs_apart_and_explain_says_why(torch_kernels, monkeypatch):
    monkeypatch.setattr(segment_kernel, "LaunchGroup", None)  # building the group fails
    jfn, _ = check_vs_eager(rope, _r(1, 4, 8, 16), _r(1, 2, 8, 16), _r(8, 16), _r(8, 16))
    (plan,) = _plans(jfn)
    assert plan.groups == {0: None} and "TypeError" in plan.decision.apart[0]
    assert "the segments sharing a launch with segment 0 launch apart: TypeError" in explain(jfn)


_COMPILE_ONE = """
import os, sys, time
sys.path.insert(0, "tests")
import thunder_fuser  # noqa: F401
from helpers import planned_parts
from test_kernels import _r
from thunder_fuser.backends.cute import backend, cache, segment_kernel
part = planned_parts(lambda x: x.exp() * 2, (_r(64, 256),))[0]
while not os.path.exists(sys.argv[1]):  # both processes compile at the same moment
    time.sleep(0.01)
assert backend.cute_available()
before = set(sys.modules)
fn = segment_kernel.compile_program(part.prog, part.geo, None)
print(type(fn).__module__, type(fn).__name__)
print(sorted(m for m in set(sys.modules) - before if m.startswith("tvm_ffi")))
print(cache.stats["compiled"], cache.stats["loaded"])
"""


def test_two_processes_compiling_one_kernel_share_the_disk_cache(tmp_path):
    """Each writer renames a private file into place, so two at once leave one whole kernel
    and no temporaries, and a third process loads it instead of compiling. That load imports
    no TVM-FFI module: the import (40-100 ms on the H100 host) comes with the DSL's, once per
    process, not with the first kernel. A launch goes straight to TVM-FFI's function in the
    processes that compiled the kernel as in the one that loaded it, never through CuTe
    DSL's two Python wrappers of it (``cache.direct_function``)."""
    pytest.importorskip("cutlass")
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", THUNDER_FUSER_CACHE=str(tmp_path / "cache"), PYTHONPATH=root)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _COMPILE_ONE, str(go)], env=env, cwd=root, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    go.touch()
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    assert all(out.splitlines()[-3] == "tvm_ffi.core Function" for out, _ in outs), outs
    files = [f.name for f in (tmp_path / "cache").rglob("*") if f.is_file()]
    assert len(files) == 1 and files[0].endswith(".o"), files
    third = subprocess.run([sys.executable, "-c", _COMPILE_ONE, str(go)], env=env, cwd=root, capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.stdout.split()[-2:] == ["0", "1"], third.stdout  # compiled 0, loaded 1
    assert third.stdout.splitlines()[-2] == "[]", third.stdout  # no TVM-FFI module imported by the load
    assert third.stdout.splitlines()[-3] == "tvm_ffi.core Function", third.stdout


def test_a_cat_with_an_empty_piece_drops_it(torch_kernels):
    """litgpt's RoPE over the whole head cats ``q[..., n:]``, which is empty: its zero-extent
    operand failed to compile ("expects positive shape mode"), a fallback on the GPU."""
    from helpers import compile_planned_kernels_to_ptx

    def fn(q, cos):
        return torch.cat((q[..., :16] * cos, q[..., 16:]), -1)

    args = (_r(2, 4, 32, 16), _r(32, 16))
    check_vs_eager(fn, *args)
    compile_planned_kernels_to_ptx(fn, args)


def _grouped_query_rope(q, k, cos, sin):
    """litgpt's attention inputs: RoPE over the whole head (a cat with ``q[..., n:]``, empty),
    then ``k`` repeated per query head (``repeat_interleave``: a broadcast merged into the
    head dim, which no stride walks)."""
    def rope(x):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return torch.cat((x * cos + rotated * sin, x[..., x.shape[-1]:]), -1)

    return rope(q) * 0.5, rope(k).repeat_interleave(q.shape[1] // k.shape[1], dim=1)


@pytest.mark.parametrize("transpose_k", [False, True], ids=["k as SDPA reads it", "k transposed (q @ k.mT)"])
def test_grouped_query_expand_and_its_backward_run_kernels(transpose_k, torch_kernels):
    """issue 30: ``repeat_interleave`` of a RoPE'd ``k`` (a broadcast merged into the heads:
    the kernel iterates over ``[b, g, r, s, e]`` instead) and its backward (a sum over the
    repeats, between kept dims: the repeats added as slices) each run as kernels, with no
    segment on the reference backend; a cat read through the expand's broadcast and
    transpose (views through a select) too."""
    def fn(q, k, cos, sin):
        q2, k2 = _grouped_query_rope(q, k, cos, sin)
        return q2, k2.mT if transpose_k else k2

    q, k = _r(2, 8, 32, 16).requires_grad_(), _r(2, 2, 32, 16).requires_grad_()
    args = (q, k, _r(32, 16), _r(32, 16))
    jfn = thunder.jit(fn, executors=[fuser_ex])
    outs = jfn(*args)
    want = fn(*args)
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w)
    grads = torch.autograd.grad(outs, (q, k), [torch.ones_like(w) for w in want])
    want_grads = torch.autograd.grad(want, (q, k), [torch.ones_like(w) for w in want])
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)
    assert_every_segment_ran_a_kernel(jfn)
    compile_planned_kernels_to_ptx(lambda q, k, c, s: fn(q.detach(), k.detach(), c, s), args)


def test_a_cat_expanded_and_merged_beside_other_stores_runs_as_a_kernel(torch_kernels):
    """RoPE'd ``k`` (a cat) repeated per query head, in one segment with q's RoPE and the
    saved broadcasts (how ThunderFX hands litgpt's attention inputs over): the program
    iterates over ``[b, g, r, s, e]`` with the cat's select and pieces moved to that domain's
    dims. The pieces were reshaped as if they were the whole source, so no merge was seen
    and the segment ran on torch ('reshape of qkv needs a copy at these strides')."""
    args = (_r(64, 16), _r(64, 16), _r(2, 32, 128))
    jfn = check_vs_eager(rope_from_one_projection, *args)[0]
    assert_every_segment_ran_a_kernel_forward(jfn)
    compile_planned_kernels_to_ptx(rope_from_one_projection, args)


def test_a_small_sum_between_kept_dims_is_added_as_slices():
    """The expand's backward, ``[b, g, r, s, e] -> [b, g, s, e]``, over r = 4 in bf16: four
    slices added in fp32 and rounded once, one pointwise segment; a sum over the last dim,
    or over the first, stays a reduction (a row or column kernel takes those)."""
    from helpers import fusion_block

    def fn(x):
        return x.sum(2), x.sum(-1), x.sum(0)

    x = torch.randn(2, 3, 4, 5, 6, dtype=torch.bfloat16)
    jfn = thunder.jit(fn, executors=[fuser_ex])
    for got, want in zip(jfn(x), fn(x.float())):
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=1e-2)
    block = fusion_block(thunder.last_traces(jfn)[-1])
    assert "t1_s3 = prims.slice_prim(t0, [0, 0, 3, 0, 0], [2, 3, 4, 5, 6], [1, 1, 1, 1, 1])" in block, block
    assert block.count("prims.sum(") == 2, block


def test_a_slice_of_a_pad_runs_as_a_kernel(torch_kernels):
    """transformers' shifted labels, ``F.pad(labels, (0, 1), value=-100)[..., 1:]``: the slice
    moves the pad's bounds and slices the piece's load (once 'slice_prim of a select result');
    a slice inside the piece and one across both pieces too."""
    def fn(t, x):
        labels = torch.nn.functional.pad(t, (0, 1), value=-100)
        padded = torch.nn.functional.pad(x, (2, 3))
        return labels[..., 1:], padded[:, 3:9], padded[1:, :4]

    args = (torch.randint(0, 50, (2, 16)), _r(3, 16))
    jfn = check_vs_eager(fn, *args)[0]
    assert_every_segment_ran_a_kernel_forward(jfn)
    compile_planned_kernels_to_ptx(fn, args)


def test_a_merge_no_stride_walks_iterates_over_the_dims_before_it(torch_kernels):
    """The grouped-query value gradient from attention, ``[b, h, s, e]`` strided as
    ``[b, s, h, e]``, summed over each group's repeats and merged back to ``[b, s, g * e]``:
    g's stride is r * e, so no view merges g and e ('needs a copy'); the kernel iterates over
    ``[b, s, g, e]`` and stores the merged tensor through a split view."""
    def fn(dv):
        b, h, s, e = dv.shape
        return (dv.reshape(b, 2, h // 2, s, e).sum(2) * 2).transpose(1, 2).reshape(b, s, 2 * e)

    dv = _r(2, 32, 8, 16).transpose(1, 2)  # [b, h, s, e], laid out [b, s, h, e]
    jfn = check_vs_eager(fn, dv)[0]
    assert_every_segment_ran_a_kernel_forward(jfn)
    compile_planned_kernels_to_ptx(fn, (dv,))


def _fused_projection_gradient(dq, dk, q_heads):
    """A fused qkv projection's gradient (transformers' Phi3 splits one projection into q, k
    and v): each head gradient ``[b, h, s, e]`` merged to ``[b, s, h * e]`` and the three
    concatenated along it; k's and v's summed over their grouped-query repeats first."""
    b, h, s, e = dk.shape
    dk = dk.reshape(b, h // 2, 2, s, e).sum(2)
    merge = lambda t: t.transpose(1, 2).reshape(b, s, -1)  # noqa: E731
    return torch.cat([merge(dq[:, :q_heads]), merge(dk), merge(dk * 2)], dim=-1)


@pytest.mark.parametrize("dq_layout", ["bhse", "bshe"])
def test_a_cat_of_merges_no_stride_walks_iterates_over_whole_heads(dq_layout, torch_kernels):
    """Each piece of the cat along the merged dim starts and ends on a whole head, so the
    kernel iterates over ``[b, s, heads, e]``, the cat a select along the heads (before:
    'reshape of ... needs a copy at these strides', four reference segments a step of
    transformers' Phi3); pieces that start inside a head (after one of 8 elements) stay
    right, whatever runs them."""
    dq = _r(2, 4, 32, 16) if dq_layout == "bhse" else _r(2, 32, 4, 16).transpose(1, 2)
    dk = _r(2, 4, 32, 16)
    jfn = check_vs_eager(_fused_projection_gradient, dq, dk, 4)[0]
    assert_every_segment_ran_a_kernel_forward(jfn)
    compile_planned_kernels_to_ptx(lambda q, k: _fused_projection_gradient(q, k, 4), (dq, dk))
    check_vs_eager(lambda q, k: torch.cat([q[:, 0, :, :8], _fused_projection_gradient(q, k, 3)], -1), dq, dk)


def test_a_merge_behind_squeezes_at_batch_one_iterates_over_the_dims_before_it(torch_kernels):
    """The same value gradient at batch 1, as thunder writes transformers' Llama's backward
    there: the sum over the repeats also sums the batch dim of one, and the merged gradient
    drops that dim for the weight gradient's matmul. Its views then wrap the merge in
    unsqueezes and squeezes; taken as one reshape (``expr._collapsed``), the merge ends the
    views and the kernel iterates over the dims before it (before: 'reshape of ... needs a
    copy at these strides', on the reference backend)."""
    def fn(dv):
        b, h, s, e = dv.shape
        summed = dv.reshape(b, 2, h // 2, s, e).sum((0, 2))[None]
        return (summed * 2).transpose(1, 2).reshape(b, s, 2 * e).reshape(s, 2 * e).mT

    dv = _r(1, 32, 8, 16).transpose(1, 2)  # [1, h, s, e], laid out [1, s, h, e]
    jfn = check_vs_eager(fn, dv)[0]
    assert_every_segment_ran_a_kernel_forward(jfn)
    compile_planned_kernels_to_ptx(fn, (dv,))


def test_a_compile_says_so_on_stderr(monkeypatch, capfd):
    """issue 30: a long first call shows what it is doing: each compiled kernel updates a
    status line (``THUNDER_FUSER_PROGRESS=1``: a line each, for logs)."""
    monkeypatch.setenv("THUNDER_FUSER_PROGRESS", "1")
    compile_planned_kernels_to_ptx(lambda x: torch.softmax(x * 2, -1), (_r(8, 256),))
    err = capfd.readouterr().err
    assert re.search(r"thunder_fuser: compiling kernels: \d+ compiled \([\d.]+ s\), \d+ from the disk cache"
                     r"(, \d+ queued for worker processes)? \(last: rows\)", err), err


@pytest.mark.parametrize("fn, make, names", [
    (layernorm, lambda: (_r(8, 4096), _r(4096), _r(4096)), ["fuser_rows_add_mean_mul_rsqrt_sub_var"]),
    (rotate_half_residual, lambda: (_r(2, 4, 33, 128, dtype=torch.bfloat16),), ["fuser_pointwise_add_cat_neg"]),
    (lambda x: (x.sum(0), x.amax(0)), lambda: (_r(64, 1000, dtype=torch.bfloat16),),
     ["fuser_columns_amax_sum", "fuser_columns_amax_sum"]),  # its two launches: partials, then the finalize
], ids=["a norm's rows", "a resize", "a column reduction's two launches"])
def test_each_kernel_is_named_by_its_family_and_ops(fn, make, names, ptx_compile):
    """A profile tells our kernels apart as it does Inductor's (``triton_red_fused_add_mean_mul_rsqrt``):
    each entry point is ``fuser_<family>_<its ops>`` before the DSL's own name."""
    from thunder_fuser.backends.cute import cache

    cache.clear_memory()
    ptx = "".join(ptx_text(segment_kernel.compile_program(p.prog, p.geo, None)) for p in planned_parts(fn, make()))
    entries = re.findall(r"\.entry\s+(\w+)", ptx)
    assert [e.split("_kernel_cutlass_")[0] for e in entries] == names, entries
    assert all("_kernel_cutlass_" in e for e in entries)  # the DSL's name after ours: unique, and ours to the zoo
