"""Cross-entropy and nll_loss as ops fuser_ex owns (``thunder_fuser/rules/cross_entropy.py``):
forward and backward against eager for every option, the regions they run in, and what
they save for backward. On the CPU the kernel segments run their lowered programs
(``THUNDER_FUSER_KERNELS=torch``), so lowering and geometry are checked too."""

import itertools

import pytest
import thunder
import torch
import torch.nn.functional as F

from helpers import assert_every_segment_ran_a_kernel, planned_parts, plans
from thunder_fuser import fuser_ex

pytestmark = pytest.mark.usefixtures("torch_kernels")  # the cuda tests below run generated kernels

OPTIONS = list(itertools.product(("mean", "sum", "none"), (False, True), (-100, 2), (0.0, 0.1)))


def _problem(n, c, dtype=torch.float32, ignore_index=-100, weight=False, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g) * 3).to(device=device, dtype=dtype)
    t = torch.randint(0, c, (n,), generator=g).to(device)
    t[:: 5] = ignore_index  # some rows ignored (ignore_index 2 is a real class too)
    w = (torch.rand(c, generator=g) + 0.5).to(device) if weight else None
    return x, t, w


def _check(fn, x, t, w, atol, target_dtype=torch.int64, **kw):
    """Loss and logits gradient through fuser_ex against eager (float64 reference where the
    logits are low precision), on fresh copies; the inputs are left as they were."""
    jfn = thunder.jit(fn, executors=[fuser_ex])
    xs = x.detach().clone().requires_grad_()
    x_before = x.detach().clone()
    out = jfn(xs, t.to(target_dtype), w, **kw)
    cot = torch.randn_like(out)
    out.backward(cot)
    ref = x.detach().clone().double().requires_grad_()
    expected = fn(ref, t, None if w is None else w.double(), **kw)
    expected.backward(cot.double())
    assert out.dtype == x.dtype and out.shape == expected.shape
    torch.testing.assert_close(out.double(), expected.double(), atol=atol, rtol=atol)
    torch.testing.assert_close(xs.grad.double(), ref.grad.double(), atol=atol, rtol=atol)
    assert xs.grad.dtype == x.dtype
    torch.testing.assert_close(xs.detach(), x_before, atol=0, rtol=0)  # the logits a user still reads are intact
    return jfn


def cross_entropy(x, t, w, **kw):
    return F.cross_entropy(x, t, weight=w, **kw)


def nll_of_log_softmax(x, t, w, **kw):
    return F.nll_loss(F.log_softmax(x, -1), t, weight=w, **kw)


@pytest.mark.parametrize("reduction,weight,ignore_index,label_smoothing", OPTIONS)
def test_cross_entropy_matches_eager_for_every_option(reduction, weight, ignore_index, label_smoothing):
    x, t, w = _problem(23, 37, ignore_index=ignore_index, weight=weight)
    jfn = _check(cross_entropy, x, t, w, 1e-5, reduction=reduction, ignore_index=ignore_index,
                 label_smoothing=label_smoothing)
    assert_every_segment_ran_a_kernel(jfn)


@pytest.mark.parametrize("reduction,weight,ignore_index", [o[:3] for o in OPTIONS if o[3] == 0.0])
def test_nll_loss_over_log_softmax_matches_eager(reduction, weight, ignore_index):
    x, t, w = _problem(19, 41, ignore_index=ignore_index, weight=weight)
    jfn = _check(nll_of_log_softmax, x, t, w, 1e-5, reduction=reduction, ignore_index=ignore_index)
    assert_every_segment_ran_a_kernel(jfn)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_logits_of_every_float_dtype(dtype):
    x, t, _ = _problem(16, 50, dtype=dtype)
    _check(cross_entropy, x, t, None, 2e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5)


@pytest.mark.parametrize("target_dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_targets_of_any_integer_dtype(target_dtype):
    """eager takes only int64 and uint8 targets; ours takes any integer dtype, and the int64
    column index is compared with the target widened first (the int64-vs-int32 kernel bug
    of every model's loss region)."""
    x, t, _ = _problem(12, 30)
    t = t.clamp(min=0)
    _check(cross_entropy, x, t, None, 1e-5, target_dtype=target_dtype)


def test_reduction_sum_of_fp32_logits_has_a_backward():
    """thunder 0.2.6's own decomposition fails here in ATen's nll_loss_backward ("expected
    scalar type Float but found Double")."""
    x, t, _ = _problem(8, 11)
    _check(lambda x, t, w: F.cross_entropy(x.float(), t, reduction="sum"), x, t, None, 1e-5)


def test_logits_of_any_row_stride_and_odd_rows():
    """A slice of wider rows (a row stride that is not the row length), a transposed view, and a
    vocabulary of odd length (50257)."""
    x, t, _ = _problem(6, 50257 + 3)
    _check(cross_entropy, x[:, 3:], t.clamp(max=50256), None, 1e-5)
    y, s, _ = _problem(33, 9)
    _check(cross_entropy, y.t().contiguous().t(), s, None, 1e-5)


def test_one_row_of_logits():
    x, t, _ = _problem(1, 29)
    _check(cross_entropy, x[0], t[0].clamp(min=0), None, 1e-5)
    _check(cross_entropy, x[0], t[0].clamp(min=0), None, 1e-5, reduction="none")


def test_every_row_ignored_gives_eagers_nan():
    x, t, _ = _problem(4, 10)
    t[:] = -100
    jfn = thunder.jit(cross_entropy, executors=[fuser_ex])
    assert torch.isnan(jfn(x, t, None)) and torch.isnan(F.cross_entropy(x, t))


def test_forward_without_grad_is_the_same_rule():
    x, t, w = _problem(10, 40, weight=True)
    jfn = thunder.jit(cross_entropy, executors=[fuser_ex])
    torch.testing.assert_close(jfn(x, t, w, label_smoothing=0.2), cross_entropy(x, t, w, label_smoothing=0.2))
    assert "cross_entropy" not in str(thunder.last_traces(jfn)[-1]), "thunder's decomposition ran"


def _loss_regions(jfn):
    fw, bw = thunder.last_traces(jfn)[-1], thunder.last_backward_traces(jfn)[-1]
    return fw, bw


def _big_outputs(trace, n, c) -> list:
    return [o for p in plans(trace) for o in p.decision.region.outputs if o.is_tensor and o.numel >= n * c]


@pytest.mark.parametrize("upcast", [False, True])
def test_a_reduced_loss_writes_its_gradient_in_the_forward_row_kernel(upcast, scalars):
    """Two passes over the logits: the forward's reductions over the classes and the gradient
    for a cotangent of one are one row kernel, which writes the gradient in the logits' dtype
    (through an upcast too: ``passes/narrow_loss_gradient.py``); the backward only scales it
    (``fuser_scale_unless_one``, which the trace says). Nothing of [rows, classes] in fp32 is
    stored, and the one bf16 tensor of that size saved for backward is the gradient."""
    n, c = 32, 3000
    x, t, _ = _problem(n, c, dtype=torch.bfloat16)
    fn = (lambda x, t: F.cross_entropy(x.float(), t)) if upcast else (lambda x, t: F.cross_entropy(x, t))
    xs = x.detach().clone().requires_grad_()
    jfn = thunder.jit(fn, executors=[fuser_ex])
    jfn(xs, t).backward()
    ref = x.detach().double().requires_grad_()
    fn(ref, t).backward()
    torch.testing.assert_close(xs.grad.double(), ref.grad, atol=1e-4, rtol=2e-2)
    fw, bw = _loss_regions(jfn)
    segs = [s for p in plans(fw) for s in p.decision.segments if s.kind != "view"]
    rows = [s for s in segs if s.kind == "normalization" and s.domain == (n, c)]
    assert len(rows) == 1 and [s for s in segs if s.domain == (n, c)] == rows, [s.describe() for s in segs]
    assert [(o.dtype, o.shape) for o in _big_outputs(fw, n, c)] == [(torch.bfloat16, (n, c))]
    assert not [s for p in plans(bw) for s in p.decision.segments if s.domain == (n, c) and s.kind != "view"]
    assert _big_outputs(bw, n, c) == []
    assert "fuser_scale_unless_one" in str(bw) and "written by its forward for a cotangent of one" in str(bw)
    assert "nll_loss_backward" not in str(bw) and "take_along" not in str(fw)


def test_a_loss_per_row_computes_its_gradient_in_one_pointwise_backward():
    """Three passes where the cotangent is per row (``reduction="none"``): the forward's row
    kernel saves per-row statistics only, the backward computes the gradient from the logits
    again in one pointwise kernel; nothing of size [rows, classes] in fp32 is saved or
    stored in either pass."""
    n, c = 32, 3000
    x, t, _ = _problem(n, c, dtype=torch.bfloat16)
    x.requires_grad_()
    jfn = thunder.jit(lambda x, t: F.cross_entropy(x, t, reduction="none"), executors=[fuser_ex])
    jfn(x, t).sum().backward()
    fw, bw = _loss_regions(jfn)
    segs = [s for p in plans(fw) for s in p.decision.segments]
    rows = [s for s in segs if s.kind == "normalization" and s.domain == (n, c)]
    assert len(rows) == 1, [s.describe() for s in segs]
    big = [s for s in segs if s.domain == (n, c) and s.kind != "view"]
    assert big == rows, [s.describe() for s in big]
    assert _big_outputs(fw, n, c) == []
    bsegs = [s for p in plans(bw) for s in p.decision.segments if s.domain == (n, c) and s.kind != "view"]
    assert [s.kind for s in bsegs] == ["pointwise"], [s.describe() for s in bsegs]
    for trace in (fw, bw):
        for p in plans(trace):
            for o in p.decision.region.outputs:
                if o.is_tensor and o.dtype == torch.float32:
                    assert o.numel < n * c, f"{o.name} {o.shape} fp32 of the logits' size in {p.decision.region.name}"


@pytest.mark.parametrize("option", ["none", "weighted mean"])
def test_three_passes_say_why_above_the_backward_region(option):
    """Where the loss keeps three passes, the backward trace says so and why, in one comment
    line right above the region that reads the logits again; the comment cuts no region in
    two (``passes/trace_notes.py``): the backward is that one region."""
    n, c = 16, 300
    x, t, _ = _problem(n, c)
    x.requires_grad_()
    if option == "none":
        fn = lambda x, t: F.cross_entropy(x, t, reduction="none").sum()  # noqa: E731
        why = "the loss is per row (reduction='none'), so each row's cotangent is known only here"
    else:
        w = torch.rand(c)
        fn = lambda x, t: F.cross_entropy(x, t, weight=w)  # noqa: E731
        why = ("a mean weighted by class weights divides by the targets' summed weights, a pass over the rows of"
               " its own before any gradient could be written in the forward")
    jfn = thunder.jit(fn, executors=[fuser_ex])
    jfn(x, t).backward()
    lines = str(thunder.last_backward_traces(jfn)[-1]).splitlines()
    note = ("  # cross_entropy: three passes over the logits (the backward reads them again and writes the"
            f" gradient): {why}")
    at = lines.index(note)
    calls = [ln for ln in lines if " = fuser" in ln and not ln.lstrip().startswith("#")]
    assert len(calls) == 1 and lines[at + 1] == calls[0], lines
    assert "three passes" not in str(thunder.last_traces(jfn)[-1])


def test_the_forward_reads_each_row_once():
    """Over rows too long for registers the max and the sum of exp(x - max) are taken online,
    and the target's logit in the same pass: the row kernel reads each row once."""
    from thunder_fuser.backends.cute.lower.expr import reads_rows_once

    x, t, _ = _problem(4, 32000, dtype=torch.bfloat16)
    parts = planned_parts(lambda x, t: F.cross_entropy(x, t), (x, t))
    rows = [p for p in parts if p.prog.family == "rows" and p.prog.domain == (4, 32000)]
    assert len(rows) == 1 and rows[0].geo.looped and reads_rows_once(rows[0].prog)


def _loads(ptx: str) -> list:
    import re

    return re.findall(r"ld\.global[.\w]*", ptx)


def _backward_parts(fn, args, traces=thunder.last_backward_traces) -> list:
    """The kernel parts of the backward regions of ``fn`` on ``args`` (the torch backend plans
    them on the CPU)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_FUSER_KERNELS", "torch")
        jfn = thunder.jit(fn, executors=[fuser_ex])
        jfn(*args).backward()
    trace = traces(jfn)[-1]
    return [part for p in plans(trace) for _, k in sorted(p.kernels.items()) if k for part in k.parts]


def _forward_parts(fn, args) -> list:
    """The kernel parts of the forward regions of a training step of ``fn``."""
    return _backward_parts(fn, args, thunder.last_traces)


@pytest.mark.parametrize("vocab", [4096, 32000, 50257])
def test_loss_kernels_compile_to_ptx_one_pass_each_way(vocab, ptx_compile):
    """The forward's row kernel loads x once per vector it walks (one pass: the online max and
    sum and the target's column beside them), in whole 16-byte vectors also over rows of odd
    length (their flat run; the column index computed per element); the backward's
    pointwise kernel over the logits stores the gradient in whole vectors. The compare
    never loads an index: the column is computed."""
    import re

    from helpers import ptx_text
    from thunder_fuser.backends.cute import segment_kernel
    from thunder_fuser.backends.cute.dsl.cute_memory import unroll

    n = 256
    x = torch.randn(n, vocab, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, vocab, (n,))
    fn = lambda x, t: F.cross_entropy(x, t, reduction="none").sum()  # noqa: E731 - three passes
    (fwd,) = [p for p in planned_parts(fn, (x.detach(), t)) if p.prog.domain == (n, vocab)]
    ptx = ptx_text(segment_kernel.compile_program(fwd.prog, fwd.geo, None))
    # a looped row's step is emitted twice: unmasked inside the row, masked after it
    steps = 2 * unroll(fwd.geo) if fwd.geo.looped else fwd.geo.row_vectors
    assert fwd.geo.vector == 8 and ptx.count("ld.global.v4.b32") == steps, re.findall(r"ld\.global[.\w]*", ptx)
    assert fwd.geo.flat == (vocab % 8 != 0)
    if not fwd.geo.flat:  # the target's logit, its index and the row's other values: once per row
        assert len(re.findall(r"ld\.global\.(?:[bsu]8|[bsu]32|[bsu]64|b16)\b", ptx)) <= 4, _loads(ptx)
    (bwd,) = [p for p in _backward_parts(fn, (x, t)) if p.prog.domain == (n, vocab)]
    ptx = ptx_text(segment_kernel.compile_program(bwd.prog, bwd.geo, None))
    assert bwd.prog.family == "pointwise" and bwd.geo.vector == 8 and "st.global.v4.b32" in ptx
    # two passes (a mean): the forward's row kernel stores the gradient in whole vectors, and
    # no backward kernel reads the logits
    fn = lambda x, t: F.cross_entropy(x, t)  # noqa: E731
    (fwd,) = [p for p in _forward_parts(fn, (x, t)) if p.prog.domain == (n, vocab)]
    ptx = ptx_text(segment_kernel.compile_program(fwd.prog, fwd.geo, None))
    assert fwd.prog.family == "rows" and fwd.geo.vector == 8 and re.search(r"st\.global(\.cs)?\.v4\.b32", ptx)
    assert not [p for p in _backward_parts(fn, (x, t)) if p.prog.domain == (n, vocab)]


def test_a_long_rows_loss_keeps_its_lines_for_the_gradient_pass(ptx_compile):
    """A vocabulary of 128256 bf16 (rows of 256 KB, looped): the online pass loads with an L2
    evict-last policy, the gradient pass marks its loads last use and streams its stores, and
    its exps are ex2.approx (the gradient is stored in bf16: ``cute_values.fast_exp``), with
    no exact exp's range reduction (``fma.rm``) anywhere. Where the looped row stores fp32, the
    exact exp stays."""
    from helpers import ptx_text
    from thunder_fuser.backends.cute import segment_kernel
    from thunder_fuser.backends.cute.dsl.cute_memory import unroll

    n, vocab = 64, 128256
    x = torch.randn(n, vocab, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, vocab, (n,))
    (fwd,) = [p for p in _forward_parts(lambda x, t: F.cross_entropy(x.float(), t), (x, t))
              if p.prog.domain == (n, vocab)]
    assert fwd.geo.looped and fwd.geo.last_use
    ptx = ptx_text(segment_kernel.compile_program(fwd.prog, fwd.geo, None))
    for access in ("ld.global.L2::cache_hint.v4.b32", "ld.global.lu.v4.b32", "st.global.cs.v4.b32"):
        assert access in ptx, _loads(ptx)
    # an exact exp is one fma.rm (and eight more instructions) per element; per row, a few
    # remain (the online sum's rescale, the logsumexp): the steps' 2 x 8 elements per vector have none
    per_element = 2 * unroll(fwd.geo) * fwd.geo.vector
    assert ptx.count("ex2.approx") >= per_element and ptx.count("fma.rm.f32") < 8
    rows = torch.randn(512, vocab, dtype=torch.bfloat16)  # enough rows for one row kernel (64 split)
    (soft,) = planned_parts(lambda x: torch.softmax(x.float(), -1), (rows,))
    assert soft.geo.looped
    assert ptx_text(segment_kernel.compile_program(soft.prog, soft.geo, None)).count("fma.rm.f32") >= per_element


@pytest.fixture
def generated_kernels(monkeypatch):
    """CUDA kernels, not the lowered programs; fresh outputs NaN, so an unwritten element fails."""
    from thunder_fuser.backends.cute import segment_kernel

    monkeypatch.delenv("THUNDER_FUSER_KERNELS", raising=False)
    monkeypatch.setattr(segment_kernel, "FILL_NAN", True)


@pytest.mark.cuda
@pytest.mark.parametrize("reduction,weight,ignore_index,label_smoothing", OPTIONS)
def test_every_option_on_kernels(reduction, weight, ignore_index, label_smoothing, generated_kernels):
    x, t, w = _problem(96, 50257, dtype=torch.bfloat16, ignore_index=ignore_index, weight=weight, device="cuda")
    jfn = _check(cross_entropy, x, t, w, 2e-2, reduction=reduction, ignore_index=ignore_index,
                 label_smoothing=label_smoothing)
    assert_every_segment_ran_a_kernel(jfn)


@pytest.mark.cuda
@pytest.mark.parametrize("vocab,dtype", [(32000, torch.bfloat16), (128256, torch.bfloat16), (4097, torch.float16),
                                         (1000, torch.float32), (256000, torch.bfloat16)])
def test_vocabularies_and_dtypes_on_kernels(vocab, dtype, generated_kernels):
    x, t, _ = _problem(64, vocab, dtype=dtype, device="cuda")
    jfn = _check(cross_entropy, x, t, None, 2e-2 if dtype != torch.float32 else 1e-4)
    assert_every_segment_ran_a_kernel(jfn)
    jfn = _check(nll_of_log_softmax, x, t, None, 2e-2 if dtype != torch.float32 else 1e-4)
    assert_every_segment_ran_a_kernel(jfn)


def test_nll_loss_without_ignore_index_ignores_torchs_default():
    """thunder's nll_loss receives None where the caller gave no ignore_index; eager ignores
    -100 then, and so must the rule."""
    x, t, _ = _problem(15, 21)
    _check(lambda x, t, w: F.nll_loss(F.log_softmax(x, -1), t), x, t, None, 1e-5)


def test_an_integer_where_beside_an_int64_vector_compiles():
    """``where(t != -100, t, 0)`` over int64 targets (thunder's nll_loss decomposition, in every
    model's loss region): the DSL took the 0 as Int32 beside an Int64 vector and refused the
    pair (KernelBugWarning "x and y must have the same dtype, but got Int64 and Int32")."""
    from helpers import compile_planned_kernels_to_ptx

    t = torch.randint(-1, 50, (64, 40))
    t[::3] = -100
    compile_planned_kernels_to_ptx(lambda t: torch.where(t != -100, t, 0) * 3, (t,))
    compile_planned_kernels_to_ptx(lambda t: torch.where(t != -100, 7, t).sum(1), (t,))


def test_a_models_loss_is_one_row_kernel_whatever_thunder_orders_first():
    """As a model writes it: logits [b, s, vocab] and targets [b, s] reshaped to rows. The
    targets' view and the per-row values join the logits' row kernel (the segmenter's view
    rule, the index computed over the broadcast targets), so the logits are read once, and
    the targets' view is one value per row to the kernel (it was "targets (64,) cannot be
    viewed over the domain (64, 512)" in litgpt's step)."""
    def loss_of(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    logits = torch.randn(2, 32, 512, requires_grad=True)
    targets = torch.randint(0, 512, (2, 32))
    targets[:, :3] = -100
    jfn = _check(lambda x, t, w: loss_of(x, t), logits, targets, None, 1e-5)
    segs = [s for p in plans(thunder.last_traces(jfn)[-1]) for s in p.decision.segments
            if s.domain == (64, 512) and s.kind != "view"]
    assert [s.kind for s in segs] == ["normalization"], [s.describe() for s in segs]
    assert all(not p.decision.fallbacks for p in plans(thunder.last_traces(jfn)[-1]))


def test_transformers_loss_upcast_before_the_flatten_is_one_row_kernel(scalars):
    """transformers' loss: ``logits.float()`` over ``[b, s, vocab]``, then ``view(-1, vocab)``,
    labels padded and shifted. The upcast once had the 3-D domain and was stored: an fp32 copy
    of the logits, and the iota of the target compare beside it (1.2 GB each for Qwen2 at
    2 x 1024 tokens on the H100). Now the reshape moves onto the bf16 logits, the upcast and
    the iota join the row kernel, and nothing of ``[tokens, vocab]`` is stored forward but
    the gradient, in bf16 (the upcast's narrowing moved into the forward through the view)."""
    def hf_loss(logits, labels):
        logits = logits.float()
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)

    logits = torch.randn(2, 32, 512, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 512, (2, 32))
    jfn = thunder.jit(hf_loss, executors=[fuser_ex])
    loss = jfn(logits, labels)
    torch.testing.assert_close(loss, hf_loss(logits, labels))
    fw = thunder.last_traces(jfn)[-1]
    big = [o for p in plans(fw) for s in p.decision.segments if s.kind != "view" for o in s.outputs if o.numel >= 64 * 512]
    assert [(o.dtype, o.shape) for o in big] == [(torch.bfloat16, (64, 512))], big
    segs = [s for p in plans(fw) for s in p.decision.segments if s.domain == (64, 512)]
    assert [s.kind for s in segs] == ["normalization"], [s.describe() for s in segs]
