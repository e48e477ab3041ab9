"""Memory layout: outputs follow their inputs' allocation order, views keep producers'
true strides (SDPA), and one trace meets new layouts at run time correctly."""

import pytest
import thunder
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from helpers import check_vs_eager
import thunder_fuser
from thunder_fuser import explain, fuser_ex
from thunder_fuser.layout import stride_order


def test_fuser_1756_channels_last_outputs_stay_channels_last():
    def f(x, s, b):
        t1 = x * s + b
        return torch.relu(t1).half(), torch.gt(t1, 0)

    cl = torch.channels_last
    x = torch.randn(32, 1024, 25, 25, dtype=torch.half).to(memory_format=cl)
    s = torch.randn(1, 1024, 1, 1, dtype=torch.half).to(memory_format=cl)
    b = torch.randn(1, 1024, 1, 1, dtype=torch.half).to(memory_format=cl)
    assert x.stride() == (640000, 1, 25600, 1024)
    jfn, outs = check_vs_eager(f, x, s, b)
    for o in outs:
        assert o.stride() == (640000, 1, 25600, 1024)
    report = explain(jfn)
    assert report.startswith("region fuser0: 14 ops in 1 segment(s)")
    assert "runs as transpose" not in report  # no layout change anywhere in the region


def _with_order(shape, order):
    """A tensor of logical ``shape`` whose dims, outermost to innermost, are ``order``
    (size-1 dims have no order of their own)."""
    base = torch.randn([shape[d] for d in order])
    t = base.permute(sorted(range(len(order)), key=lambda i: order[i]))
    assert 1 in shape or stride_order(t.shape, t.stride()) == tuple(order)
    return t


@st.composite
def layout_programs(draw):
    ndim = draw(st.integers(2, 5))
    shape = tuple(draw(st.lists(st.integers(2, 4), min_size=ndim, max_size=ndim)))
    n_full = draw(st.integers(1, 2))
    orders = [tuple(draw(st.permutations(range(ndim)))) for _ in range(n_full)]
    if n_full == 2 and draw(st.booleans()):
        orders[1] = orders[0]  # agreeing inputs are the common case
    bcast_kind = draw(st.sampled_from(["none", "suffix", "expanded", "keepdim"]))
    reduce_dims = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim - 1, unique=True))
    return shape, orders, bcast_kind, tuple(sorted(reduce_dims))


def _broadcast_operand(shape, kind):
    if kind == "suffix":  # fewer dims, its own (transposed) order
        return torch.randn(shape[-1], shape[-2]).t() if len(shape) >= 2 else torch.randn(shape[-1])
    if kind == "expanded":  # full rank with stride-0 dims
        return torch.randn(shape[-1]).expand(shape)
    if kind == "keepdim":  # size-1 dims, channels-last-like strides
        s = [1] * len(shape)
        s[0] = shape[0]
        return _with_order(tuple(s), tuple(reversed(range(len(shape)))))
    return None


@given(layout_programs())
def test_output_orders_follow_the_rule(program):
    shape, orders, bcast_kind, reduce_dims = program
    fulls = [_with_order(shape, o) for o in orders]
    extra = _broadcast_operand(shape, bcast_kind)

    def f(*args):
        y = args[0] * 2.0
        for a in args[1:]:
            y = y + a
        return torch.tanh(y), y.sum(reduce_dims)

    args = fulls + ([extra] if extra is not None else [])
    _, (out, red) = check_vs_eager(f, *args)
    # as eager lays them out (each elementwise op as TensorIterator: the first operand that
    # orders a pair of dims decides it; a reduction keeps its operand's order of the kept dims)
    eo, ered = f(*args)
    assert stride_order(out.shape, out.stride()) == stride_order(eo.shape, eo.stride())
    assert stride_order(red.shape, red.stride()) == stride_order(ered.shape, ered.stride())


def test_one_trace_meets_contiguous_transposed_and_channels_last_inputs():
    def f(x, y):
        return torch.relu(x * y + 1), (x - y).sum(1)

    jfn = thunder.jit(f, executors=[fuser_ex])
    base = torch.randn(2, 3, 4, 5)
    cases = [
        # name, x, strides of x and of the elementwise output, order of the reduction's output
        ("contiguous", base.clone(), (60, 20, 5, 1), (0, 1, 2)),
        # a reduction's result is contiguous whatever its input's layout, as torch allocates it
        ("transposed", base.clone().transpose(2, 3).contiguous().transpose(2, 3), (60, 20, 1, 4), (0, 1, 2)),
        ("channels_last", base.clone().to(memory_format=torch.channels_last), (60, 1, 15, 3), (0, 1, 2)),
    ]
    for name, x, strides, red_order in cases:
        assert x.stride() == strides, name
        y = torch.randn_like(x)  # same layout as x
        out, red = jfn(x, y)
        eo, er = f(x, y)
        torch.testing.assert_close(out, eo)
        torch.testing.assert_close(red, er)
        assert out.stride() == strides, name
        assert stride_order(red.shape, red.stride()) == red_order == stride_order(er.shape, er.stride()), name
    assert thunder.cache_misses(jfn) == 1  # one trace, three layouts


B, S, H, E = 2, 16, 4, 8


def _attention_block(x, w, bias):
    b, s, _ = x.shape
    qkv = x @ w
    q, k, v = qkv.view(b, s, 3, H, E).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, s, H * E) + bias


def _runners(jfn):
    trace = thunder.last_traces(jfn)[-1]
    return [b._call_ctx[b.sym.name] for b in trace.bound_symbols if b.sym.name.startswith("fuser")]


def _check_attention_block(device, backend=None, dtype=torch.float32):
    x = torch.randn(B, S, H * E, device=device, dtype=dtype)
    w = torch.randn(H * E, 3 * H * E, device=device, dtype=dtype) / 8
    bias = torch.randn(H * E, device=device, dtype=dtype)
    jfn = thunder.jit(_attention_block, executors=[fuser_ex, "sdpa", "torch"])
    if backend is None:
        got = jfn(x, w, bias)
    else:
        with torch.nn.attention.sdpa_kernel(backend):
            got = jfn(x, w, bias)
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, _attention_block(x, w, bias), atol=tol, rtol=tol)
    # the trace's code, without its comment lines (they quote source paths, which may hold "clone")
    text = "\n".join(l for l in str(thunder.last_traces(jfn)[-1]).splitlines() if not l.lstrip().startswith("#"))
    for copy_op in ("contiguous", "stride_order", "clone", "copy_("):
        assert copy_op not in text
    split, epilogue = _runners(jfn)
    assert [s.kind for s in split.segments] == ["view"]  # q, k, v are views of the projection
    qkv = x @ w
    for t in split(qkv):
        assert t.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert "runs as transpose" not in explain(jfn)  # the epilogue reads SDPA's layout as it is
    return epilogue


def test_qkv_split_sdpa_and_output_reshape_need_no_layout_copy():
    _check_attention_block("cpu")


def _split_and_scale(qkv):
    b, s, _ = qkv.shape
    q, k, v = (t.view(b, s, H, E).transpose(1, 2) for t in qkv.split(H * E, dim=-1))
    return q * 0.5, k.transpose(-2, -1) * 0.5, v


def test_a_split_whose_v_is_a_view_returns_it_as_one_beside_the_kernel_outputs():
    """The GPT block's forward (no sdpa_ex): q and k scaled by a kernel, v passed on as a
    view of the projection, with the projection's strides, never copied into a new layout."""
    jfn = thunder.jit(_split_and_scale, executors=[fuser_ex])
    for _ in range(2):  # the first call plans, the second runs the straight-line code
        qkv = torch.randn(B, S, 3 * H * E)
        got = jfn(qkv)
        for g, w in zip(got, _split_and_scale(qkv)):
            torch.testing.assert_close(g, w)
        assert got[2].untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    (runner,) = _runners(jfn)
    assert [s.kind for s in runner.segments] == ["resize"]


def _grouped_keys(qkv):
    """Grouped-query attention's keys and values as litgpt and transformers make them for
    ``sdpa``: two groups, each repeated for two query heads (an expand, then a reshape that
    merges the expanded dim: torch copies it, row-major)."""
    b, s, _ = qkv.shape
    k, v = (t.view(b, s, 2, E).transpose(1, 2) for t in qkv.split(2 * E, dim=-1))
    return tuple(t[:, :, None].expand(b, 2, 2, s, E).reshape(b, 4, s, E) * 1 for t in (k, v)) + (
        v[:, :, None].expand(b, 2, 2, s, E).reshape(b, 4, s, E),)


def test_a_reshape_torch_makes_by_copying_is_row_major_as_torch_makes_it():
    """Outputs leave the trace with eager's strides, which whoever receives them may rely
    on: ThunderFX hands a thunder piece's outputs to Inductor's piece, which asserts them
    (Mistral-7B's keys, repeated per query head, came back heads inside the sequence: the
    expanded source's order, where torch's copy is row-major)."""
    jfn = thunder.jit(_grouped_keys, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    for _ in range(2):
        qkv = torch.randn(B, S, 4 * E)
        want = _grouped_keys(qkv)
        got = jfn(qkv)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
            assert g.stride() == w.stride(), (g.stride(), w.stride())


def _attention_of_a_returned_query(qkv):
    b, s, _ = qkv.shape
    q, k, v = (t.view(b, s, H, E).transpose(1, 2) for t in qkv.split(H * E, dim=-1))
    q = torch.cat((q[..., E // 2:], q[..., : E // 2]), dim=-1)  # contiguous, as torch allocates a cat
    return F.scaled_dot_product_attention(q, k, v, is_causal=True), q


def test_a_tensor_the_caller_receives_keeps_eagers_strides_though_attention_reads_it():
    """The heads-inside order attention prefers (``layout/attention_operands.py``) is for
    tensors only the trace reads: one the caller receives (a ThunderFX piece's output, which
    Inductor's next piece asserts) is laid out as eager lays it out, and so is the attention
    output made like it."""
    jfn = thunder.jit(_attention_of_a_returned_query, executors=thunder_fuser.executors(),
                      transforms=thunder_fuser.transforms())
    qkv = torch.randn(B, S, 3 * H * E)
    for g, w in zip(jfn(qkv), _attention_of_a_returned_query(qkv)):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride(), (g.stride(), w.stride())


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"])
def test_qkv_split_sdpa_on_gpu_backends(backend):
    from torch.nn.attention import SDPBackend

    torch.manual_seed(0)
    x = torch.randn(B, S, 3 * H * E, device="cuda", dtype=torch.bfloat16)
    q, k, v = x.view(B, S, 3, H, E).unbind(2)
    with torch.nn.attention.sdpa_kernel(getattr(SDPBackend, backend)):
        try:
            o = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
        except RuntimeError as e:
            pytest.skip(f"{backend} unavailable here: {e}")
    epilogue = _check_attention_block("cuda", getattr(SDPBackend, backend), torch.bfloat16)
    # whatever strides SDPA returned, the epilogue specialized on them (no copy to contiguous)
    print(backend, "eager SDPA output strides", o.stride(), "epilogue plans", list(epilogue.plans))
