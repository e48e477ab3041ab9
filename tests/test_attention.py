"""attention_ex: SDPA beside our regions, with and without a mask, forward and backward
against eager; what it leaves to the executors after it. On the CPU it runs torch's CPU
flash kernel laid out as cuDNN's outputs are; the ``cuda`` test runs cuDNN's attention."""

from __future__ import annotations

import copy
import math

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser


def _claimed(jfn) -> bool:
    return "fuser_attention_forward" in str(thunder.last_traces(jfn)[-1])


def _qkv(device, dtype, sq=8, sk=8, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, s, 16, generator=g).to(device, dtype) for s in (sq, sk, sk))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


MASKS = {
    "bool [1, 1, sq, sk]": lambda sq, sk: torch.ones(sq, sk, dtype=torch.bool).tril()[None, None],
    "bool [sq, sk]": lambda sq, sk: torch.ones(sq, sk, dtype=torch.bool).tril(),
    "bool one row per head [2, 4, 1, sk]": lambda sq, sk: torch.rand(2, 4, 1, sk, generator=torch.Generator().manual_seed(1)) > 0.3,
    "additive [1, 1, sq, sk]": lambda sq, sk: torch.randn(1, 1, sq, sk, generator=torch.Generator().manual_seed(2)),
}


def _masked_matches_eager(mask_name: str, device: str, dtype, tol: float, sq: int = 8) -> None:
    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)

    mask = MASKS[mask_name](sq, 8).to(device)
    if mask.dtype != torch.bool:
        mask = mask.to(dtype)
    if mask_name.startswith("bool one row"):
        mask[..., 0] = True  # no row with every key masked (its softmax is undefined)
    ours, want_in = _qkv(device, dtype, sq=sq), _qkv(device, dtype, sq=sq)
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    got, want = jf(*ours, mask), f(*want_in, mask)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    for a, b in zip(ours, want_in):
        torch.testing.assert_close(a.grad, b.grad, atol=tol, rtol=tol)
    assert _claimed(jf), "a masked SDPA went past attention_ex"


@pytest.mark.parametrize("mask_name", list(MASKS))
def test_masked_attention_runs_on_attention_ex_and_matches_eager(mask_name):
    _masked_matches_eager(mask_name, "cpu", torch.float32, 1e-5)


def test_a_decode_step_mask_one_query_over_the_cache():
    """litgpt's decode: one query against every cached key, the mask's row for the position."""
    _masked_matches_eager("bool [1, 1, sq, sk]", "cpu", torch.float32, 1e-5, sq=1)


def test_a_bias_that_needs_a_gradient_and_a_mask_with_is_causal_are_left_to_the_next_executor():
    q, k, v = _qkv("cpu", torch.float32)
    bias = torch.randn(1, 1, 8, 8, requires_grad=True)

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    jf = thunder.jit(f, executors=thunder_fuser.executors())
    torch.testing.assert_close(jf(q, k, v, bias), f(q, k, v, bias))
    assert not _claimed(jf)


@pytest.mark.cuda
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_masked_attention_on_cudnn(mask_name):
    _masked_matches_eager(mask_name, "cuda", torch.bfloat16, 2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("first", ["transposed", "contiguous"])
def test_cudnn_backward_is_right_whatever_layout_the_output_gradient_arrives_in(first):
    """torch 2.11's cuDNN attention caches its backward plan per shapes and q/k/v/out
    strides but not the output gradient's: a gradient laid out otherwise than the one of the
    call that built the plan comes back 1.4 (relative) off, silently (eager SDPA does so on
    the H200). Our backward hands the gradient over in the output's strides, so every order
    of layouts gives fp32's gradients."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    b, h, t, d = 2, 8, 320, 128
    torch.manual_seed(0)
    q0, k0, v0 = (torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    mask = torch.full((t, t), float("-inf"), device="cuda", dtype=torch.bfloat16).triu(1).view(1, 1, t, t)
    transposed = torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    layouts = {"transposed": transposed, "contiguous": transposed.contiguous()}
    second = "contiguous" if first == "transposed" else "transposed"

    def grads(fn, g):
        q, k, v = (x.detach().clone().requires_grad_() for x in (q0, k0, v0))
        fn(q, k, v, mask).backward(g)
        return q.grad, k.grad, v.grad

    with sdpa_kernel([SDPBackend.MATH]):
        want = grads(lambda q, k, v, m: f(q.float(), k.float(), v.float(), m.float()).to(q.dtype), transposed)
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    for name in (first, second, first):
        for got, w in zip(grads(jf, layouts[name]), want):
            assert ((got.float() - w.float()).norm() / w.float().norm()).item() < 1e-2, name
    assert _claimed(jf)


@pytest.mark.cuda
@pytest.mark.parametrize("d", [64, 128, 256])
def test_cudnn_takes_heads_up_to_256_and_matches_fp32(d):
    """pythia's and Gemma's heads are 256 wide: attention_ex takes them where torch's own
    cuDNN check passes (before, only up to 128, and sdpa_ex's FlashAttention-2 ran them),
    forward and gradients within bf16's rounding of fp32's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch.manual_seed(0)
    qkv0 = [torch.randn(2, 4, 256, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    g = torch.randn(2, 4, 256, d, device="cuda", dtype=torch.bfloat16)

    def run(fn, *, up=lambda t: t):
        qkv = [x.clone().requires_grad_() for x in qkv0]
        out = fn(*(up(t) for t in qkv))
        out.backward(g.to(out.dtype))
        return [out] + [t.grad for t in qkv]

    with sdpa_kernel([SDPBackend.MATH]):
        want = run(f, up=lambda t: t.float())
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    for got, w in zip(run(jf), want):
        assert ((got.float() - w.float()).norm() / w.float().norm()).item() < 1e-2
    assert _claimed(jf), f"heads of {d} went past attention_ex"


@pytest.mark.parametrize("way", ["thunder.jit", "ThunderFX"])
def test_grouped_query_attention_by_enable_gqa_matches_eager(way):
    """issue 62: ``enable_gqa=True`` (current PyTorch's grouped-query attention) failed with
    every executor in thunder 0.2.6 ('unexpected keyword argument'): translated into key and
    value repeated per query head (``patches/missing_torch_ops.py``), forward and gradients as eager's."""
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    if way == "thunder.jit":
        fn = thunder.jit(f, executors=thunder_fuser.executors())
    else:
        from thunder.dynamo import ThunderCompiler

        torch._dynamo.reset()
        backend = ThunderCompiler(executors=thunder_fuser.executors())
        fn = torch.compile(f, backend=backend)
    q, k, v = (torch.randn(2, h, 16, 32, requires_grad=True) for h in (8, 2, 2))
    got, want = fn(q, k, v), f(q, k, v)
    torch.testing.assert_close(got, want)
    if way == "ThunderFX":  # thunder took the attention (it left it to Inductor before)
        assert [f for info in backend.subgraph_infos for f in info.thunder_compiled_fns]
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g))


class _GQABlock(torch.nn.Module):
    """Grouped-query attention as Llama-style models write it: one projection for q, k and
    v, a rotation of q and k, k and v expanded over each group's query heads."""

    def __init__(self, d=64, heads=4, groups=2):
        super().__init__()
        self.h, self.g, self.e = heads, groups, d // heads
        self.qkv = torch.nn.Linear(d, (heads + 2 * groups) * self.e, bias=False)
        self.proj = torch.nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split((self.h * self.e, self.g * self.e, self.g * self.e), dim=-1)
        q, k, v = (t.reshape(b, s, -1, self.e).transpose(1, 2) for t in (q, k, v))

        def rotate(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

        q, k = rotate(q), rotate(k)
        k, v = (t[:, :, None].expand(b, self.g, self.h // self.g, s, self.e).reshape(b, self.h, s, self.e)
                for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


def test_attention_reads_heads_inside_the_sequence_and_nothing_copies_around_it():
    """Region outputs attention reads are laid out [b, s, h, d] in memory (the projections'
    order): the output attention allocates like q then goes back to [b, s, h * d] as a view,
    and grouped-query attention reads k and v at their own heads as the region's kernel
    stores them, never expanded nor copied by torch's reshape
    (H200, Llama-3.2-1B: 32 such copies a step, 0.88 ms, before the kernel stored them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    block = _GQABlock()
    x = torch.randn(2, 16, 64, requires_grad=True)
    cos, sin = torch.randn(16, 16), torch.randn(16, 16)
    jb = thunder.jit(block, executors=thunder_fuser.executors())
    jb(x, cos, sin).sum().backward()  # compiled; now watch one call

    seen = {"attention": [], "copied": []}

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default:
                seen["attention"].append([(tuple(a.shape), a.stride()) for a in args[:3]])
                seen["out"] = out[0].data_ptr()
            elif func in (torch.ops.aten.clone.default, torch.ops.aten.copy_.default) and "out" in seen:
                if any(isinstance(a, torch.Tensor) and a.data_ptr() == seen["out"] for a in args):
                    seen["copied"].append(func)
            return out

    x.grad = None
    block.zero_grad()
    with Watch():
        y = jb(x, cos, sin)
    # q [b, s, h, d] in memory; k and v at their two heads (never expanded), k as the
    # rotation's kernel writes it, v a copy of its slice of the projection (which a saved
    # view would hold whole to the backward), written by the same kernel
    heads_inside = lambda row: (16 * row, 16, row, 1)  # noqa: E731
    assert seen["attention"] == [[((2, 4, 16, 16), heads_inside(64)), ((2, 2, 16, 16), heads_inside(32)),
                                  ((2, 2, 16, 16), (512, 256, 16, 1))]], seen["attention"]
    assert not seen["copied"], "the attention output was copied to go back to [b, s, h * d]"

    want_x = x.detach().clone().requires_grad_()
    want = block(want_x, cos, sin)
    torch.testing.assert_close(y, want)
    y.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, want_x.grad)


class _RotaryTailBlock(torch.nn.Module):
    """Grouped-query attention with RoPE over the first ``rope`` dims of each head and the
    rest passed on by a ``cat``, the keys and values repeated per query head, as litgpt
    writes it (``rope`` the head's size: the tail is empty, its gradient a pad of nothing)."""

    def __init__(self, rope: int, d=64, heads=4, groups=2, sliced=False):
        super().__init__()
        self.h, self.g, self.e, self.rope = heads, groups, d // heads, rope
        self.sliced = sliced  # cos and sin come as the rows of these positions already
        self.qkv = torch.nn.Linear(d, (heads + 2 * groups) * self.e, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        if not self.sliced:
            cos, sin = cos[:s], sin[:s]  # the rows of the model's cache for these positions
        q, k, v = self.qkv(x).split((self.h * self.e, self.g * self.e, self.g * self.e), dim=-1)
        q, k, v = (t.view(b, s, -1, self.e).transpose(1, 2) for t in (q, k, v))

        def rotate(t):
            head, half = t[..., :self.rope], self.rope // 2
            roped = head * cos + torch.cat((-head[..., half:], head[..., :half]), dim=-1) * sin
            return torch.cat((roped, t[..., self.rope:]), dim=-1)

        q, k = rotate(q), rotate(k)
        k, v = (t.repeat_interleave(self.h // self.g, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)


def _stepped_as_eager(block, x, cos, sin):
    """``block`` jitted with the README's executors, stepped forward and backward on ``x``:
    its output and the gradients of ``x`` and the projection as near a float64 copy's as an
    eager copy's are (``assert_as_near_float64``: attention sums grouped-query K's and V's
    gradients over each group in fp32 before one rounding, where eager rounds each head's
    first, so the two 16-bit results differ by rounding, ours the nearer). The jitted block,
    for its traces."""
    from helpers import assert_as_near_float64

    want_block, want_x = copy.deepcopy(block), x.detach().clone().requires_grad_()
    exact_block, exact_x = copy.deepcopy(block).double(), x.detach().double().requires_grad_()
    jb = thunder.jit(block, executors=thunder_fuser.executors())
    y = jb(x, cos, sin)
    g = torch.randn_like(y)
    y.backward(g)
    want = want_block(want_x, cos, sin)
    want.backward(g)
    exact = exact_block(exact_x, cos.double(), sin.double())
    exact.backward(g.double())
    for what, got, eager, truth in (("output", y, want, exact), ("x's gradient", x.grad, want_x.grad, exact_x.grad),
                                    ("the projection's gradient", block.qkv.weight.grad, want_block.qkv.weight.grad,
                                     exact_block.qkv.weight.grad)):
        assert_as_near_float64(got.detach(), eager.detach(), truth.detach(), what)
    return jb


@pytest.mark.parametrize("rope", [16, 8], ids=["every dim rotated", "half the dims"])
def test_the_rotary_backward_of_grouped_keys_is_one_kernel_into_the_projections_gradient(rope, torch_kernels, ptx_compile):
    """The backward of q's and k's rotation, of the key and value heads' repeat (a sum over
    each group) and of the split of the projection's output is one kernel that reads the
    three bf16 gradients attention returns and writes the projection's: no fp32
    temporaries between launches. With every dim rotated the tail's gradient is a pad of an
    empty tensor, a constant that once opened a segment of its own and pulled q's and k's
    gradients into it through fp32 (litgpt's Qwen2.5-1.5B at 2 x 2048 tokens, a layer that
    slices its own cos and sin: 118 MB read and written where 55 do). The kernel compiles
    for sm_90a. The forward's rotation of q and k and
    the repeats of k and v run as one launch too."""
    from helpers import plans, ptx_text

    from thunder_fuser.backends.cute import segment_kernel

    torch.manual_seed(0)
    block = _RotaryTailBlock(rope).to(torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = (torch.randn(32, rope, dtype=torch.bfloat16) for _ in range(2))
    jb = _stepped_as_eager(block, x, cos, sin)

    [cat_plan] = [p for p in plans(thunder.last_backward_traces(jb)[-1])
                  if any(n.op == "cat" for s in p.decision.segments for n in s.nodes)]
    kernels = [k for _, k in sorted(cat_plan.kernels.items()) if k is not None]
    assert len(kernels) == 1 and len(kernels[0].parts) == 1, thunder_fuser.explain(jb)
    [part] = kernels[0].parts
    assert {st.target.dtype for st in part.prog.stores} == {torch.bfloat16}
    assert ".target sm_90a" in ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))

    # the forward's rotation and repeats: one segment whose programs (one per shape stored)
    # are independent, so one launch (``segment_kernel.shares_launch``)
    [rope_plan] = [p for p in plans(thunder.last_traces(jb)[-1])
                   if any(n.op == "cat" for s in p.decision.segments for n in s.nodes)]
    [k] = [k for k in rope_plan.kernels.values() if k is not None]
    assert k.shares and len(k.parts) == 2, thunder_fuser.explain(jb)
    assert ptx_text(segment_kernel.compile_group(k.parts, None)).count(".entry") == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_a_multi_query_keys_gradient_summed_over_many_heads_runs_on_kernels_in_16_bits(dtype, torch_kernels,
                                                                                      ptx_compile, monkeypatch):
    """falcon-7b's one key and value head serve 71 query heads: their gradients, as attention
    returns them, [b, s, 71, e] in memory, are summed over the 71 heads, kept dims on both
    sides of the reduced one. Too many heads to add as slices (``small_reductions``), and no
    column kernel walks two kept runs, so on the H100 the sums ran on the reference backend
    (0.2 ms a layer). In 16 bits they now run as rows after a transposing copy; in fp32 the
    reference's single sum moves fewer bytes and stays, with its reason. Gradients match
    eager's either way, and the kernels compile for sm_90a. The sums are made where the
    expansion stays (``THUNDER_FUSER_GQA=0``, and on CUDA by default until cuDNN's grouped
    call is checked there); otherwise attention sums the heads itself."""
    from helpers import plans, ptx_text

    monkeypatch.setenv("THUNDER_FUSER_GQA", "0")

    from thunder_fuser.backends.cute import segment_kernel

    heads, e = 40, 64
    torch.manual_seed(0)
    block = _RotaryTailBlock(e, d=heads * e, heads=heads, groups=1).to(dtype)
    x = torch.randn(2, 16, heads * e, dtype=dtype, requires_grad=True)
    cos, sin = (torch.randn(32, e, dtype=dtype) for _ in range(2))
    jb = _stepped_as_eager(block, x, cos, sin)

    fallbacks = [r for p in plans(thunder.last_backward_traces(jb)[-1]) for r in p.decision.fallbacks.values()]
    if dtype == torch.float32:
        assert fallbacks == ["the kept dims of a column reduction are not one contiguous run for every operand"]
        return
    assert fallbacks == [], thunder_fuser.explain(jb)
    [sums] = [k for p in plans(thunder.last_backward_traces(jb)[-1]) for k in p.kernels.values()
              if k is not None and any(pt.prog.family == "rows" for pt in k.parts)]
    assert [pt.prog.family for pt in sums.parts] == ["pointwise", "rows"]  # the staged copy, the sums
    for part in sums.parts:
        assert ".target sm_90a" in ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))


def test_the_rotation_of_cos_and_sin_sliced_before_the_region_is_one_launch(torch_kernels):
    """litgpt slices its cos and sin cache once for all layers: every layer but the first
    gets them as region inputs, viewed as ``[1, 1, s, d]``, broadcast over the heads and
    cast. Those views once opened segments of their own, and the rotation split into the
    rotated halves stored in fp32 and a second kernel reading them back (the H200's zoo:
    the ``cat_neg`` and ``pointwise_group_add_mul`` kernels of every layer of
    Qwen2.5-1.5B); each segment that reads them now computes them (``segmenter._floats``)."""
    from helpers import plans

    torch.manual_seed(0)
    block = _RotaryTailBlock(16, sliced=True).to(torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    cos, sin = (torch.randn(16, 16, dtype=torch.bfloat16) for _ in range(2))
    jb = thunder.jit(block, executors=thunder_fuser.executors())
    torch.testing.assert_close(jb(x, cos, sin), block(x, cos, sin))
    [rope_plan] = [p for p in plans(thunder.last_traces(jb)[-1])
                   if any(n.op == "cat" for s in p.decision.segments for n in s.nodes)]
    kernels = [k for k in rope_plan.kernels.values() if k is not None]
    assert len(kernels) == 1 and (len(kernels[0].parts) == 1 or kernels[0].shares), thunder_fuser.explain(jb)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_a_middle_reduction_on_kernels_keeps_eagers_answer_on_values_built_to_break_it(dtype, torch_kernels):
    """The rows-over-a-copy layout of a sum whose kept dims lie on both sides of the reduced
    one, on a program it was not written for (no attention: a plain sum over the third of
    four dims, 40 long): NaN, inf and huge values, an input read twice (once through a
    transposed view), and the sum written into an input in place; values and the gradient
    as eager's, the input updated as eager updates it. The first sum runs on kernels; the
    second, which also reads the first's fp32 result, stays on the reference backend with
    its reason (an fp32 operand: ``geometry``'s byte rule)."""
    from helpers import plans

    def f(x, out):
        s = x.sum(2) + x.transpose(1, 2).sum(1) * 0.5
        out.copy_(s)
        return s * 2

    torch.manual_seed(0)
    x = torch.randn(2, 8, 40, 16, dtype=dtype)
    x[0, 0, 3, 0], x[0, 1, 5, 1], x[1, 2, 7, 2] = float("nan"), float("inf"), -float("inf")
    x[1, 3, :, 3] = 3e4 if dtype == torch.float16 else 1e30
    x.requires_grad_()
    out, want_out = torch.zeros(2, 8, 16, dtype=dtype), torch.zeros(2, 8, 16, dtype=dtype)
    want_x = x.detach().clone().requires_grad_()
    jf = thunder.jit(f, executors=thunder_fuser.executors())
    y = jf(x, out)
    want = f(want_x, want_out)
    torch.testing.assert_close(y, want, equal_nan=True)
    torch.testing.assert_close(out, want_out, equal_nan=True)
    g = torch.randn_like(y)
    y.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, want_x.grad, equal_nan=True)
    fallbacks = [f for p in plans(thunder.last_traces(jf)[-1]) for f in p.decision.fallbacks.items()]
    assert fallbacks == [(1, "the kept dims of a column reduction are not one contiguous run for every operand")]


class _ContiguousBlock(torch.nn.Module):
    """transformers' SDPA path (ViT, BERT-style encoders): q, k and v projected apart, viewed
    as heads, made contiguous before attention; the output transposed back and made
    contiguous. ``reuse_q``: q's projection is also read after attention."""

    def __init__(self, d=64, h=4, reuse_q=False, heads_innermost=False):
        super().__init__()
        self.h, self.reuse_q, self.heads_innermost = h, reuse_q, heads_innermost
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape
        if self.heads_innermost:  # each head's dims h apart in memory: a view cuDNN cannot read
            heads = lambda t: t.view(b, s, d // self.h, self.h).permute(0, 3, 1, 2)  # noqa: E731
        else:
            heads = lambda t: t.view(b, s, self.h, d // self.h).transpose(1, 2)  # noqa: E731
        qp = self.q(x)
        q, k, v = (heads(t).contiguous() for t in (qp, self.k(x), self.v(x)))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).contiguous().reshape(b, s, d)
        y = self.o(y)
        return y + qp.sin() if self.reuse_q else y


def _copies_of_a_step(jb, x) -> tuple[list, object]:
    """The aten copies (``clone``, ``copy_``) one jitted step runs, and its output."""
    from torch.utils._python_dispatch import TorchDispatchMode

    copies = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.clone.default, torch.ops.aten.copy_.default):
                copies.append((func.__name__, tuple(args[0].shape)))
            return func(*args, **(kwargs or {}))

    with Watch():
        y = jb(x)
        y.backward(torch.ones_like(y))
    return copies, y


@pytest.mark.parametrize("reuse_q,heads_innermost", [(False, False), (True, False), (False, True)],
                         ids=["projections die at attention", "q's projection read after", "head dims apart"])
def test_contiguous_operands_of_attention_are_views_of_projections_that_die_there(reuse_q, heads_innermost):
    """``.contiguous()`` of q, k and v viewed as heads (a copy each in eager) is a view where
    the projection dies there: attention reads the projection's layout, lays its output and
    gradients out like it, and the output's ``.contiguous()``, the gradients' reshapes back
    to ``[b, s, h * d]`` and the output gradient's relayout copy nothing either (hf-ViT's
    H100 step: 1.0 ms of such copies in 29). Where q's projection is read after attention,
    q's copy stays (writing over it would be seen). With each head's dims apart in memory the
    views are made too (the CPU's attention reads any strides; cuDNN's gets a copy: the
    ``cuda`` test below). Values and gradients as eager's."""
    torch.manual_seed(0)
    block = _ContiguousBlock(reuse_q=reuse_q, heads_innermost=heads_innermost)
    want_block = copy.deepcopy(block)
    x = torch.randn(2, 16, 64, requires_grad=True)
    want_x = x.detach().clone().requires_grad_()
    jb = thunder.jit(block, executors=thunder_fuser.executors())
    jb(x).sum().backward()  # compiled; now watch one step
    x.grad = None
    block.zero_grad()
    copies, y = _copies_of_a_step(jb, x)
    want = want_block(want_x)
    want.backward(torch.ones_like(want))
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(x.grad, want_x.grad)
    for p, w in zip(block.parameters(), want_block.parameters()):
        torch.testing.assert_close(p.grad, w.grad)
    # with q's projection alive, its copy remains, and q's layout then differs from the
    # output's: the CPU path lays the gradients out as cuDNN would, which copies
    if not heads_innermost:
        assert (copies == []) if not reuse_q else copies, copies
    notes = _view_notes(jb)
    assert notes.count("x.contiguous() as a view") == (2 if reuse_q else 3), notes


def _view_notes(jfn) -> str:
    """The region notes of the last forward trace of ``jfn``."""
    return "\n".join(n for v in thunder.last_traces(jfn)[-1].python_ctx().values()
                     if hasattr(v, "plans") for p in v.plans.values() for n in p.decision.region.notes)


@pytest.mark.cuda
@pytest.mark.parametrize("heads_innermost", [False, True], ids=["heads inside the sequence", "head dims apart"])
def test_contiguous_operands_made_views_reach_cudnn_as_it_reads_them(heads_innermost):
    """On the GPU, bf16: the views of the projections go to cuDNN as they are, and one whose
    head dims lie apart in memory (last stride not 1) is copied for it
    (``attention._dense_last``); forward and backward as eager's."""
    torch.manual_seed(0)
    block = _ContiguousBlock(d=512, h=8, heads_innermost=heads_innermost).cuda().to(torch.bfloat16)
    want_block = copy.deepcopy(block)
    x = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    want_x = x.detach().clone().requires_grad_()
    jb = thunder.jit(block, executors=thunder_fuser.executors())
    g = torch.randn(2, 256, 512, device="cuda", dtype=torch.bfloat16)
    y = jb(x)
    y.backward(g)
    want = want_block(want_x)
    want.backward(g)
    assert "fuser_attention_forward" in str(thunder.last_traces(jb)[-1])
    torch.testing.assert_close(y, want, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(x.grad, want_x.grad, atol=2e-2, rtol=2e-2)
    for p, w in zip(block.parameters(), want_block.parameters()):
        torch.testing.assert_close(p.grad, w.grad, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("strided", ["q", "k", "v", "all"])
def test_attention_operands_whose_last_dim_is_strided_keep_eagers_values(strided):
    """SDPA of operands whose head dims lie apart in memory (a permute, no ``contiguous()``):
    torch's CPU flash kernel, which our attention calls directly, read such operands wrongly
    (every output and gradient off, silently) where eager's SDPA picks its math kernel; each
    operand is now handed over with a dense last dim (``attention._dense_last``)."""
    torch.manual_seed(0)
    b, s, h, d = 2, 16, 4, 16

    def fn(xq, xk, xv):
        apart = lambda t: t.view(b, s, d, h).permute(0, 3, 1, 2)  # noqa: E731
        heads = lambda t: t.view(b, s, h, d).transpose(1, 2)  # noqa: E731
        q, k, v = ((apart if strided in (name, "all") else heads)(t) for name, t in zip("qkv", (xq, xk, xv)))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    xs = [torch.randn(b, s, h * d, requires_grad=True) for _ in range(3)]
    want_xs = [x.detach().clone().requires_grad_() for x in xs]
    jfn = thunder.jit(fn, executors=thunder_fuser.executors())
    y, want = jfn(*xs), fn(*want_xs)
    assert "fuser_attention_forward" in str(thunder.last_traces(jfn)[-1])
    torch.testing.assert_close(y, want)
    g = torch.randn_like(y)
    y.backward(g)
    want.backward(g)
    for x, w in zip(xs, want_xs):
        torch.testing.assert_close(x.grad, w.grad)


def _heads(t, h=4):
    b, s, d = t.shape
    return t.view(b, s, h, d // h).transpose(1, 2)


_W = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) / 8


def _project(t):
    """A projection the caller's tensor goes through (its gradient then ends at a matmul)."""
    return t @ _W.to(t.dtype)


BREAK_THE_VIEW_RULE = {
    # the contiguous copy written in place: the trace writes in place, nothing is a view
    "written in place": lambda qp, kp, vp: F.scaled_dot_product_attention(
        _heads(_project(qp)).contiguous().mul_(0.5), _heads(_project(kp)).contiguous(), _heads(_project(vp)).contiguous()),
    # the projections are the caller's tensors (inputs of the trace): they are not the trace's to alias
    "of the caller's tensors": lambda qp, kp, vp: F.scaled_dot_product_attention(
        _heads(qp).contiguous(), _heads(kp).contiguous(), _heads(vp).contiguous()),
    # q handed back to the caller, who sees its strides: contiguous as eager's
    "handed back": lambda qp, kp, vp: (lambda q: (F.scaled_dot_product_attention(
        q, _heads(_project(kp)).contiguous(), _heads(_project(vp)).contiguous()), q))(_heads(_project(qp)).contiguous()),
    # q also read by a reduction after attention: it reads whatever layout q has
    "read by a sum too": lambda qp, kp, vp: (lambda q: F.scaled_dot_product_attention(
        q, _heads(_project(kp)).contiguous(), _heads(_project(vp)).contiguous()) + q.sum(-1, keepdim=True))(
        _heads(_project(qp)).contiguous()),
    # one projection read as q and as k (two views of one tensor that dies there): neither is made a view
    "q and k of one projection": lambda qp, kp, vp: (lambda p: F.scaled_dot_product_attention(
        _heads(p).contiguous(), _heads(p).contiguous(), _heads(_project(vp)).contiguous()))(_project(qp) + kp),
    # the view rule's own case, its output scaled and handed back: k and v are views, q keeps its copy
    "views, scaled after": lambda qp, kp, vp: F.scaled_dot_product_attention(
        _heads(_project(qp)).contiguous(), _heads(_project(kp)).contiguous(), _heads(_project(vp)).contiguous()) * 3.0,
}


def _break_the_view_rule_inputs(values: str, dtype) -> list:
    """The projections' inputs: normal, or huge (1e30, one 3e38 that the projection makes
    infinite), with a NaN and an inf in v's (each poisons what reads it, in eager as here)."""
    xs = [torch.randn(2, 16, 64) for _ in range(3)]
    if values == "huge, NaN and inf":
        xs[0] *= 1e30
        xs[1][0, 3, 5] = 3e38
        xs[2][1, 7, 2], xs[2][0, 1, 60] = math.nan, math.inf
    return [x.to(dtype).requires_grad_() for x in xs]


@pytest.mark.parametrize("values,dtype", [("normal", torch.float32), ("normal", torch.bfloat16),
                                          ("huge, NaN and inf", torch.float32)], ids=["fp32", "bf16", "huge NaN inf"])
@pytest.mark.parametrize("case", list(BREAK_THE_VIEW_RULE))
def test_contiguous_before_attention_keeps_eagers_values_strides_and_inputs_where_the_view_rule_is_pushed(
        case, values, dtype):
    """Programs the view rule was not written for, around its conditions, in fp32 and bf16 and
    on huge, NaN and infinite values: values (NaN where eager's), gradients and the strides of
    what the caller gets back as eager's, the caller's tensors unchanged."""
    torch.manual_seed(0)
    fn = BREAK_THE_VIEW_RULE[case]
    xs = _break_the_view_rule_inputs(values, dtype)
    before = [x.detach().clone() for x in xs]
    want_xs = [x.detach().clone().requires_grad_() for x in xs]
    jfn = thunder.jit(fn, executors=thunder_fuser.executors())
    got, want = jfn(*xs), fn(*want_xs)
    got, want = (r if isinstance(r, tuple) else (r,) for r in (got, want))
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, **tol)
        assert g.stride() == w.stride(), (g.stride(), w.stride())
    sum(g.sum() for g in got).backward()
    sum(w.sum() for w in want).backward()
    for x, w, b in zip(xs, want_xs, before):
        torch.testing.assert_close(x.grad, w.grad, equal_nan=True, **tol)
        assert torch.allclose(x.detach(), b, rtol=0, atol=0, equal_nan=True)  # unchanged, bit for bit
    views = _view_notes(jfn).count("x.contiguous() as a view")
    # k's and v's copies are views wherever their projections die there; q's stays wherever the
    # caller's output follows its layout (attention lays its output out like q), or it is handed back
    expected = {"views, scaled after": 2, "q and k of one projection": 1, "handed back": 2, "read by a sum too": 2}
    assert views == expected.get(case, 0), (case, views)
