"""Fewer regions per step: ops of other executors hoisted out of the way of our regions
(``thunder_fuser/passes/hoist_externs.py``), ``x.contiguous()`` claimed as ``stride_order``, and a
write into a region's own temporary elided (transformers' causal mask). Each is checked
against eager, and for the region count the program's trace gives."""

import pytest
from hypothesis import given, settings, strategies as st
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser
from helpers import check_vs_eager, compile_planned_kernels_to_ptx, fusion_names, plans
from thunder_fuser.attention import cudnn_bias


def _projections(x, wq, wk, wv):
    """transformers' attention: project q, view it, project k, view it, project v."""
    q = F.linear(x, wq).view(2, 8, 4, 8).transpose(1, 2)
    k = F.linear(x, wk).view(2, 8, 2, 8).transpose(1, 2)
    v = F.linear(x, wv).view(2, 8, 2, 8).transpose(1, 2)
    return q * 2.0, k + 1.0, v.float()


def _mlp(x, wg, wu):
    """transformers' MLP: SiLU of the gate's projection, then the up projection."""
    return F.silu(F.linear(x, wg)) * F.linear(x, wu)


def _calls(jfn) -> list[str]:
    return [b.sym.name for b in thunder.last_traces(jfn)[-1].bound_symbols
            if b.sym.name not in ("unpack_trivial", "unpack_sequence", "python_return", "python_del")]


def test_projections_read_by_one_region():
    x = torch.randn(2, 8, 32)
    jfn, _ = check_vs_eager(_projections, x, torch.randn(32, 32), torch.randn(16, 32), torch.randn(16, 32))
    assert _calls(jfn) == ["linear", "linear", "linear", "fuser0"]


def test_the_mlp_gate_and_up_meet_in_one_region():
    x = torch.randn(2, 8, 32)
    jfn, _ = check_vs_eager(_mlp, x, torch.randn(64, 32), torch.randn(64, 32))
    assert _calls(jfn) == ["linear", "linear", "fuser0"]


def _reads_its_own_input(x, w):
    """An op of another executor that reads a region's result stays after it; the second
    region is not cut in two for a hoist into its middle."""
    h = torch.tanh(x) * 2.0
    a = F.linear(h, w)
    return a.relu(), h + 1.0, F.linear(x, w)


def test_an_op_reading_a_region_result_is_not_hoisted_above_it():
    jfn, _ = check_vs_eager(_reads_its_own_input, torch.randn(4, 16), torch.randn(16, 16))
    assert len(fusion_names(jfn)) == 2


def _read_then_written(buf, w, x):
    """A matmul reads ``buf`` before the program writes it in place: the read must see the
    old values, so no op moves across the write."""
    y = x * 3.0
    buf.mul_(2.0)
    z = F.linear(buf, w)
    buf.add_(y)
    return z, F.linear(buf, w)


def test_no_op_moves_across_an_in_place_write():
    check_vs_eager(_read_then_written, torch.randn(4, 16), torch.randn(16, 16), torch.randn(4, 16))


def _between_input_gradient_matmuls(dq, dk, dv, wq, wk, wv):
    """transformers' attention backward after the attention: the input gradient is a sum of
    three matmuls, and between them the program sums a bias gradient, views the next
    projection's gradient for its matmul and views the results to add them."""
    gq, gk, gv = dq * 2.0, dk * 3.0, dv.tanh()
    x = gv.reshape(-1, 16) @ wv
    bv = gv.sum((0, 1))  # a reduction of what the region before made: up into it
    x2 = gk.reshape(-1, 16) @ wk  # a view a matmul reads: torch takes it, in no region
    bk = gk.sum((0, 1))
    s = x.view(2, 8, 32) + x2.view(2, 8, 32)  # reads the matmuls: down into the region after
    x3 = gq.reshape(-1, 16) @ wq
    return (s.view(-1, 32) + x3).relu(), bv, bk


@pytest.mark.parametrize("dissolve", ["1", "0"])
def test_the_regions_between_the_input_gradients_matmuls_dissolve(dissolve, monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_DISSOLVE", dissolve)
    grads = [torch.randn(2, 8, 16) for _ in range(3)]
    jfn, _ = check_vs_eager(_between_input_gradient_matmuls, *grads, *[torch.randn(16, 32) for _ in range(3)])
    assert len(fusion_names(jfn)) == (2 if dissolve == "1" else 3)


def _elementwise_for_the_matmul(x, w):
    """A run whose op a matmul after it reads and that is no view stays in a region: with
    the run before the first matmul (``join_across_externs``: ``h * 2.0`` reads ``h``, not
    ``a``), then the sum after both."""
    h = x.tanh()
    a = h @ w
    b = (h * 2.0) @ w
    return (a + b).relu()


def test_a_run_that_computes_a_matmuls_operand_stays():
    jfn, _ = check_vs_eager(_elementwise_for_the_matmul, torch.randn(8, 16), torch.randn(16, 16))
    assert len(fusion_names(jfn)) == 2


def _contiguous_then_view(x, w):
    """The attention output's ``transpose(1, 2).contiguous().view(b, s, -1)``: a ``view``
    that only a dense tensor allows, then a matmul."""
    y = (x * 2.0).transpose(1, 2).contiguous()
    return F.linear(y.view(y.shape[0], y.shape[1], -1), w), x.transpose(1, 2).contiguous()


def test_contiguous_is_claimed_and_lays_its_result_out_dense():
    x = torch.randn(2, 4, 8, 16)
    jfn, (out, t) = check_vs_eager(_contiguous_then_view, x, torch.randn(32, 64))
    assert t.is_contiguous() and "contiguous" not in _calls(jfn)


@pytest.mark.parametrize("shape", [(1, 4, 1, 16), (2, 3, 5, 7)])
def test_a_contiguous_tensor_stays_itself_and_any_other_is_copied_dense(shape):
    def f(x):
        return x.transpose(1, 2).contiguous(), x.contiguous()

    jfn, (t, same) = check_vs_eager(f, torch.randn(shape))
    assert t.is_contiguous() and same.is_contiguous()


def _causal_mask(pos):
    """transformers' causal mask: a ``full``, written in place, then handed out as views."""
    m = torch.full((pos.numel(), 32), torch.finfo(torch.float32).min)
    m *= torch.arange(32) > pos.reshape(-1, 1)
    return m[None, None, :, :].expand(2, 1, -1, -1)


def test_a_write_into_a_regions_own_temporary_runs_on_kernels(monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_KERNELS", "torch")
    jfn, _ = check_vs_eager(_causal_mask, torch.arange(5, 12))
    assert all(not p.decision.fallbacks for p in plans(thunder.last_traces(jfn)[-1]))


def _written_after_viewed(x):
    """A view of the temporary taken before the write must show the write: no elision."""
    t = torch.zeros(4, 8) + 1.0
    v = t[1:3]
    t.mul_(x)
    return v * 1.0, t.sum()


def test_a_view_taken_before_the_write_sees_it():
    check_vs_eager(_written_after_viewed, torch.randn(4, 8))


def test_a_mask_is_handed_to_cudnn_with_dense_aligned_rows():
    col_major = torch.randn(512, 16, dtype=torch.bfloat16).t()[None, None].expand(1, 32, 16, 512)
    ragged = torch.randn(1, 1, 16, 17, dtype=torch.bfloat16)
    for bias in (col_major, ragged):
        got = cudnn_bias(bias)
        assert torch.equal(got, bias) and got.stride(-1) == 1
        assert all(s % 8 == 0 for n, s in zip(got.shape[:-1], got.stride()[:-1]) if n != 1 and s != 0)
        assert [s == 0 for s in got.stride()] == [s == 0 for s in bias.stride()]  # broadcast stays broadcast
    aligned = torch.randn(1, 1, 16, 32, dtype=torch.bfloat16).expand(2, 4, 16, 32)
    assert cudnn_bias(aligned) is aligned


def test_thunder_fuser_executors_keep_the_joins():
    """The README's call (our attention, the prologue transform) sees the same regions."""
    x = torch.randn(2, 8, 32)
    jfn = thunder.jit(_mlp, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    torch.testing.assert_close(jfn(x, torch.ones(64, 32), torch.ones(64, 32)), _mlp(x, torch.ones(64, 32), torch.ones(64, 32)))
    assert _calls(jfn) == ["linear", "linear", "fuser0"]




@pytest.mark.parametrize("fn, args", [
    (_contiguous_then_view, (torch.randn(2, 4, 8, 16), torch.randn(32, 64))),
    (_causal_mask, (torch.arange(5, 12),)),
], ids=["contiguous then view", "causal mask"])
def test_their_kernels_compile_for_the_gpu(fn, args):
    compile_planned_kernels_to_ptx(fn, args)


def _backward_regions(jfn) -> list:
    return [b for b in thunder.last_backward_traces(jfn)[-1].bound_symbols
            if b.sym.name.startswith("fuser") and b.sym.is_fusion]


def _swiglu_mlp(x, w1, w2, w3):
    return F.linear(F.silu(F.linear(x, w1)) * F.linear(x, w2), w3)


def test_the_swiglu_backward_makes_its_product_again_in_its_own_region(monkeypatch):
    """The down projection's weight gradient reads the product the backward makes again
    (``passes/recompute_in_backward.py``); the SwiGLU backward after that matmul reads the
    same fc1 and fc2 and not the matmul's result: ``join_across_externs`` moves it above
    the matmul, one region and one pass over fc1 and fc2 that also writes the product: as
    many regions as with the product saved."""
    from helpers import check_gradients

    args = (torch.randn(16, 32), [torch.randn(96, 32) / 6, torch.randn(96, 32) / 6, torch.randn(32, 96) / 10])
    jfn = check_gradients(_swiglu_mlp, *args)
    [region] = [r for r in _backward_regions(jfn) if any(o.shape == (16, 96) for o in r.flat_proxy_outs)
                and len([o for o in r.flat_proxy_outs if o.shape in ((16, 96), (96, 16))]) >= 3]
    monkeypatch.setenv("THUNDER_FUSER_RECOMPUTE", "0")
    before = check_gradients(_swiglu_mlp, torch.randn(16, 32), [torch.randn(96, 32) / 6, torch.randn(96, 32) / 6,
                                                                torch.randn(32, 96) / 10])
    assert len(_backward_regions(jfn)) == len(_backward_regions(before))


def _gelu_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def test_the_gelu_backward_makes_its_output_again_beside_a_bias_gradient(monkeypatch):
    """A GELU MLP with biases (GPT-NeoX's, GPT-2's): the down projection's weight gradient
    reads the GELU's output made again; the run after that matmul, the GELU's backward,
    also sums the output's gradient over the tokens (the down projection's bias gradient), a
    reduction over values the run before neither reads nor makes, so the run joins it
    (``_reduces_what_it_shares``): one region reads the pre-activation once and writes the
    GELU's output and its gradient, as many regions as with the output saved."""
    from helpers import check_gradients

    def args():
        return (torch.randn(16, 32), [torch.randn(96, 32) / 6, torch.randn(96) / 6, torch.randn(32, 96) / 10,
                                      torch.randn(32) / 10])

    jfn = check_gradients(_gelu_mlp, *args())
    [region] = [r for r in _backward_regions(jfn) if len([o for o in r.flat_proxy_outs if o.shape == (16, 96)]) >= 2]
    assert any(o.shape == (32,) for o in region.flat_proxy_outs)  # the bias gradient beside them
    monkeypatch.setenv("THUNDER_FUSER_RECOMPUTE", "0")
    before = check_gradients(_gelu_mlp, *args())
    assert len(_backward_regions(jfn)) == len(_backward_regions(before))


def test_a_run_that_reads_the_matmul_stays_after_it():
    """A run that reads the block's result cannot move above it; nor one with a reduction
    (a norm's backward: see ``join_across_externs``): gradients as eager's either way."""
    from helpers import check_gradients

    def fn(x, w1, w2):
        h = torch.tanh(x @ w1)
        return ((h @ w2) * h.sum(-1, keepdim=True)).sum(-1)

    check_gradients(fn, torch.randn(8, 16), [torch.randn(16, 16) / 4, torch.randn(16, 16) / 4])


_ACTS = [torch.tanh, F.silu, F.gelu, lambda t: F.gelu(t, approximate="tanh"), torch.sigmoid, lambda t: t * 0.5]


@settings(max_examples=25, deadline=None)
@given(acts=st.lists(st.integers(0, len(_ACTS) - 1), max_size=3), bias=st.booleans(),
       gated=st.booleans(), norm=st.booleans(), heads=st.booleans(), prenorm=st.booleans(), recompute=st.booleans())
def test_random_blocks_between_matmuls_keep_eagers_gradients_on_kernels(acts, bias, gated, norm, heads, prenorm,
                                                                        recompute):
    """Random blocks of what a transformer puts between its matmuls (biases, gated or plain
    activations, an RMS norm before or after, heads split for batched matmuls and merged back), with the backward
    made again or not (``passes/recompute_in_backward.py``): whatever runs join across the
    matmuls (``join_across_externs``), output and every gradient as eager's, inputs
    unchanged, and no segment left to the reference backend (no region falls back to the reference backend
    because a joined run handed out a view that needs a copy)."""
    from helpers import check_gradients

    def fn(x, w1, b1, w2, b2, w3):
        if prenorm:  # made again in the backward for the projections' weight gradients
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        h = F.linear(x, w1, b1 if bias else None)
        for i in acts:
            h = _ACTS[i](h)
        if gated:
            h = h * F.linear(x, w2)
        if norm:
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        if heads:  # [tokens, 4 heads x 24] as [heads, tokens, 24] into batched matmuls (attention's shape),
            # and back: the backward hands the matmuls' gradient out as a reshape of a transpose
            t = h.reshape(h.shape[0], 4, 24).transpose(0, 1)
            t = torch.softmax(t @ t.transpose(-1, -2) * 0.2, -1) @ t
            h = t.transpose(0, 1).reshape(h.shape[0], 96)
        return F.linear(h, w3, b2 if bias else None)

    gen = torch.Generator().manual_seed(sum(acts) * 31 + len(acts) * 7 + bias + 2 * gated + 4 * norm + 8 * heads + 16 * prenorm)
    draw = lambda *s, scale=1.0: torch.randn(*s, generator=gen) * scale  # noqa: E731
    x = draw(16, 32)
    params = [draw(96, 32, scale=1 / 6), draw(96, scale=0.1), draw(96, 32, scale=1 / 6), draw(32, scale=0.1),
              draw(32, 96, scale=0.1)]
    before = [t.clone() for t in (x, *params)]
    with pytest.MonkeyPatch().context() as m:
        m.setenv("THUNDER_FUSER_RECOMPUTE", "1" if recompute else "0")
        jfn = check_gradients(fn, x, params)
    fallbacks = [(p.decision.region.name, r) for trace in (thunder.last_traces(jfn)[-1], thunder.last_backward_traces(jfn)[-1])
                 for p in plans(trace) for r in p.decision.fallbacks.values()]
    assert fallbacks == []
    for t, b in zip((x, *params), before):
        assert torch.equal(t.detach(), b)


def _kernel_kinds(trace) -> list[str]:
    """The kind of every segment of ``trace``'s regions that runs a kernel (views run none)."""
    return [p.decision.kinds[i] for p in plans(trace) for i in sorted(p.kernels) if p.decision.kinds[i] != "view"]


def _segment_of(trace, shape) -> list[str]:
    """The lines of the segment (in ``trace``'s printout) whose outputs include a tensor of
    ``shape``: its header and its ops."""
    lines = [l.strip() for l in str(trace).splitlines()]
    for i, l in enumerate(lines):
        if l.startswith("# segment") and "->" in l:
            ops = []
            for m in lines[i + 1:]:
                if not m.startswith("#   "):
                    break
                ops.append(m)
            if any(f"{shape}" in o or "sum(" in o for o in ops) and any("erf" in o for o in ops):
                return [l, *ops]
    return []


def test_a_bias_gradients_sum_joins_the_kernel_that_makes_the_gradient(monkeypatch):
    """The up projection's bias gradient sums the GELU's input gradient over the tokens; the
    backward writes that sum after the matmuls that read the same gradient, so it sat in
    the next region and read the gradient from memory again. ``hoist_reductions`` moves it
    up beside the GELU's backward: one column kernel stores the gradient and sums it on the
    way (as Inductor's ``gelu_backward_sum``), one kernel fewer, gradients as eager's."""
    from helpers import check_gradients

    def args():
        return (torch.randn(16, 32), [torch.randn(96, 32) / 6, torch.randn(96) / 6, torch.randn(32, 96) / 10,
                                      torch.randn(32) / 10])

    jfn = check_gradients(_gelu_mlp, *args())
    bw = thunder.last_backward_traces(jfn)[-1]
    seg = _segment_of(bw, (96,))
    assert seg and "[reduction: sum over dims (0,)]" in seg[0], "\n".join(seg) or str(bw)
    monkeypatch.setattr(thunder_fuser.executor, "hoist_reductions", lambda bsyms, claimed: bsyms)
    before = check_gradients(_gelu_mlp, *args())
    assert len(_kernel_kinds(bw)) == len(_kernel_kinds(thunder.last_backward_traces(before)[-1])) - 1


def _sum_read_again(a, w):
    """A sum a claimed op reads (a statistic, not a result only the return takes) stays
    where the program wrote it."""
    h = torch.tanh(a)
    y = h @ w
    return y, h.sum(0) * 2.0


def _sum_of_a_cat(a, b, w):
    """A sum of a cat's result: no kernel takes a cat and a sum, so it does not move."""
    h = torch.cat([a, b], -1)
    return h @ w, h.sum(0)


def _sum_after_a_write(a, w):
    """The program writes ``h`` in place after the matmul reads it, then sums it: the sum
    must see the write, so it never moves above it."""
    h = torch.tanh(a)
    y = h @ w
    h.mul_(2.0)
    return y, h.sum(0)


def _sum_of_two_producers(a, b, w):
    """A sum of a value made from two regions' results: it moves no higher than the later."""
    h = torch.tanh(a)
    y = h @ w
    g = (y * b).sum(0)
    return y, g, h.sum(0)


@pytest.mark.parametrize("fn, shapes", [
    (_sum_read_again, [(16, 32), (32, 8)]),
    (_sum_of_a_cat, [(16, 16), (16, 16), (32, 8)]),
    (_sum_after_a_write, [(16, 32), (32, 8)]),
    (_sum_of_two_producers, [(16, 32), (16, 8), (32, 8)]),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sums_that_must_not_move_keep_eagers_answer(fn, shapes, dtype):
    args = [torch.randn(*s).to(dtype) for s in shapes]
    args[0][0, :3] = torch.tensor([float("inf"), -0.0, float("nan")])  # edge values through the moved sums
    check_vs_eager(fn, *args)


def test_a_sum_a_claimed_op_reads_stays_with_its_reader():
    """A norm's statistics are such sums: moved away from the rows that read them, they
    would pass through memory; the sum stays in the region of the op that reads it."""
    jfn, _ = check_vs_eager(_sum_read_again, torch.randn(16, 32), torch.randn(32, 8))
    regions = [b for b in thunder.last_traces(jfn)[-1].bound_symbols if b.sym.name.startswith("fuser")]
    [with_sum] = [r for r in regions if any(s.sym.name == "sum" for s in r.subsymbols)]
    assert any(s.sym.name == "mul" for s in with_sum.subsymbols), [s.sym.name for s in with_sum.subsymbols]


def test_a_sum_of_a_cat_stays_out_of_the_cats_region():
    """No kernel takes a cat and a sum (RoPE's backward and the QKV bias gradient): moved in,
    the resize kernel stored the sum's fp32 upcast for a column kernel of its own."""
    jfn, _ = check_vs_eager(_sum_of_a_cat, torch.randn(16, 16), torch.randn(16, 16), torch.randn(32, 8))
    regions = [b for b in thunder.last_traces(jfn)[-1].bound_symbols if b.sym.name.startswith("fuser")]
    [with_cat] = [r for r in regions if any(s.sym.name == "cat" for s in r.subsymbols)]
    assert not any(s.sym.name == "sum" for s in with_cat.subsymbols)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["huge", "transposed input", "edge values", "aliased bias"])
def test_a_moved_bias_sum_keeps_eagers_gradients_on_odd_inputs(case, dtype):
    """The bias sum ``hoist_reductions`` moves, on inputs it was not written for: values
    near bf16's range, a transposed (strided) input, inf/-0/NaN, and the two biases one
    tensor (aliased): output, every gradient and the inputs afterwards against eager."""
    x = torch.randn(32, 16) if case == "transposed input" else torch.randn(16, 32)
    if case == "transposed input":
        x = x.t()
    if case == "huge":
        x = x * 1e18
    if case == "edge values":
        x[0, :3] = torch.tensor([float("inf"), -0.0, float("nan")])
    w1, w2 = torch.randn(32, 32) / 6, torch.randn(32, 32) / 6
    b1 = torch.randn(32) / 6
    b2 = b1 if case == "aliased bias" else torch.randn(32) / 6
    args = [t.to(dtype).detach().requires_grad_() for t in (x, w1, b1, w2)]
    args.append(args[2] if case == "aliased bias" else b2.to(dtype).requires_grad_())
    ref = [t.detach().clone().requires_grad_() for t in args[:4]]
    ref.append(ref[2] if case == "aliased bias" else args[4].detach().clone().requires_grad_())
    jfn = thunder.jit(_gelu_mlp, executors=thunder_fuser.executors())
    out, want = jfn(*args), _gelu_mlp(*ref)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    tol = dict(atol=1e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out, want, equal_nan=True, **tol)
    for a, r in zip(args, ref):
        torch.testing.assert_close(a, r, equal_nan=True)
        torch.testing.assert_close(a.grad, r.grad, equal_nan=True, **tol)
