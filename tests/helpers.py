"""Shared test helpers: run a function jitted with fuser_ex beside eager, compare outputs
and the final contents of every input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import thunder
import torch

from thunder_fuser import fuser_ex


def clone_tensor(a: torch.Tensor) -> torch.Tensor:
    """A copy with the same storage layout: strides, offset and stride-0 dims included
    (``clone`` would make an expanded tensor dense)."""
    storage = a.detach().untyped_storage().clone()
    c = torch.empty(0, dtype=a.dtype, device=a.device).set_(storage, a.storage_offset(), a.shape, a.stride())
    return c.requires_grad_(a.requires_grad)


def clone_args(args):
    """Tensors cloned, inside lists and tuples too (an optimizer step takes lists of them)."""
    return [_clone_tree(a) for a in args]


def _clone_tree(a):
    if isinstance(a, torch.Tensor):
        return clone_tensor(a)
    if isinstance(a, (list, tuple)):
        return type(a)(_clone_tree(x) for x in a)
    return a


def _tensors(a) -> list:
    if isinstance(a, torch.Tensor):
        return [a]
    if isinstance(a, (list, tuple)):
        return [t for x in a for t in _tensors(x)]
    return []


def tol(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return dict(atol=2e-2, rtol=2e-2)
    return dict(atol=1e-5, rtol=1.3e-6)


def _run_beside_eager(fn, args, executors=None, **kwargs):
    """Jit ``fn`` and run eager once and it twice, each on fresh copies of ``args`` (the
    second call runs a region's generated straight-line code, ``runtime/straight_line.py``);
    assert that every input ends as eager leaves it. Returns the jitted function, its two
    results and eager's."""
    jfn = thunder.jit(fn, executors=executors or [fuser_ex])
    theirs = clone_args(args)
    gots = []
    for call in range(2):
        ours = clone_args(args)
        gots.append(jfn(*ours, **kwargs))
        if call == 0:
            expected = fn(*theirs, **kwargs)
        for a, b in zip(_tensors(ours), _tensors(theirs)):
            torch.testing.assert_close(a, b, equal_nan=True, **_tol_of(b))
    return jfn, gots, expected


def check_vs_eager(fn, *args, executors=None, **kwargs):
    """Jit ``fn``, run it (twice) and eager on copies of ``args``; assert outputs and inputs match."""
    jfn, gots, expected = _run_beside_eager(fn, args, executors, **kwargs)
    for got in gots:
        torch.testing.assert_close(got, expected, equal_nan=True, **_tol_of(expected))
    return jfn, gots[-1]


def check_vs_float64(fn, *args):
    """For long reductions, where the order of summation alone moves an fp32 result by more
    than the default tolerance: each output must pass ``assert_as_near_float64`` (a sum of
    131k fp32 values near 360 has an ulp of 3e-5, above the fp32 tolerance: eager's error
    there was 1.5 ulps and ours 3.5 in one H100 run), and inputs must end as eager leaves them."""
    jfn, gots, expected = _run_beside_eager(fn, args)
    expected = _as_list(expected)
    wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    exact = _as_list(fn(*wide))
    for got in map(_as_list, gots):
        assert len(got) == len(expected) == len(exact)
        for i, (g, e, x) in enumerate(zip(got, expected, exact)):
            assert_as_near_float64(g, e, x, f"output {i}")
    return jfn, gots[-1]


def assert_as_near_float64(got: torch.Tensor, eager: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """``got`` is at most twice as far from the float64 result ``exact`` as ``eager`` is, plus
    the dtype's tolerance and 4 ulps of the largest exact value, with eager's shape, dtype and
    NaN pattern. Two low-precision results can each sit a few ulps from the truth on opposite
    sides (bf16 layernorm's weight gradient: 3 ulps apart in one CI run, as thunder's own
    executors are); comparing them with each other fails where both are right."""
    assert (got.shape, got.dtype) == (eager.shape, eager.dtype), (what, got.shape, got.dtype, eager.shape, eager.dtype)
    assert torch.equal(got.isnan(), eager.isnan()), f"{what}: NaN where eager has none, or the reverse"
    ok = ~exact.isnan()
    err_ours = (got.double() - exact)[ok].abs().max().item() if ok.any() else 0.0
    err_eager = (eager.double() - exact)[ok].abs().max().item() if ok.any() else 0.0
    ulps = 4 * torch.finfo(eager.dtype).eps * (exact[ok].abs().max().item() if ok.any() else 0.0)
    bound = 2 * err_eager + tol(eager.dtype)["atol"] + ulps
    assert err_ours <= bound, f"{what}: {err_ours:.3g} from float64, eager {err_eager:.3g}"


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _tol_of(x):
    if isinstance(x, torch.Tensor):
        return tol(x.dtype)
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return tol(x[0].dtype)
    return {}


def fusion_names(jfn) -> list[str]:
    return [b.sym.name for b in thunder.last_traces(jfn)[-1].bound_symbols if b.sym.name.startswith("fuser")]


def fusion_block(trace, name: str = "fuser0") -> str:
    """The lines of ``trace`` that call fusion ``name``: the call and its segments."""
    lines = str(trace).splitlines()
    start = next(i for i, l in enumerate(lines) if f"= {name}(" in l)
    end = start + 1
    while end < len(lines) and lines[end].lstrip().startswith("# ") and lines[end].startswith("    #"):
        end += 1
    return "\n".join(l.strip() for l in lines[start:end]) + "\n"


def check_gradients(fn, x, params, atol=1e-4, require_kernels: bool = False):
    """Output and gradients of ``fn(x, *params)`` through fuser_ex against eager.
    ``require_kernels``: every segment of the forward and backward regions must have run a
    kernel (or, on the CPU, the lowered program)."""
    x, params = x.requires_grad_(), [p.requires_grad_() for p in params]
    jfn = thunder.jit(fn, executors=[fuser_ex])
    out = jfn(x, *params)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref = [t.detach().clone().requires_grad_() for t in (x, *params)]
    expected = fn(*ref)
    expected.backward(grad)
    torch.testing.assert_close(out, expected, atol=atol, rtol=atol)
    for t, r in zip((x, *params), ref):
        torch.testing.assert_close(t.grad, r.grad, atol=atol, rtol=atol)
    if require_kernels:
        assert_every_segment_ran_a_kernel(jfn)
    return jfn


def check_layernorm_backward(device: str, shape=(64, 4097), atol=1e-4, require_kernels: bool = False):
    """``F.layer_norm`` (backward regions mix row reductions, column reductions and saved
    broadcasts)."""
    from benchmarks.workloads import layernorm

    n = shape[-1]
    x, w, b = (torch.randn(*s, device=device) for s in [shape, (n,), (n,)])
    check_gradients(layernorm, x, [w, b], atol, require_kernels)


def norm_backward(x, w, g, rstd):
    """A norm backward written out: RMSNorm's input gradient, then a layer norm's weight and
    bias gradients (sums over every dim but the last). The row sum comes first, as in
    thunder's backward traces, so the sums over the rows join its segment as sums per
    column."""
    xhat = x * rstd
    gw = g * w
    dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
    rows = tuple(range(x.ndim - 1))
    return dx, (g * xhat).sum(rows), g.sum(rows)


def norm_backward_args(shape, dtype=torch.float32, device="cpu", transposed=False):
    """x, w, g and rstd for ``norm_backward``; ``transposed``: x and g laid out with their
    rows strided (2-D), so the output's rows are not innermost."""
    def full():
        t = torch.randn(*(reversed(shape) if transposed else shape), dtype=dtype, device=device)
        return t.t() if transposed else t

    rstd = torch.rand(*shape[:-1], 1, dtype=dtype, device=device) + 0.5
    return full(), torch.randn(shape[-1], dtype=dtype, device=device), full(), rstd


def check_norm_backward(shape, dtype, device, expect: str, transposed=False):
    """``norm_backward`` against float64 (sums over many rows round differently in any
    order), with ``expect`` in explain()'s report: where its sums per column ran."""
    from thunder_fuser.inspect.explain import explain

    jfn, _ = check_vs_float64(norm_backward, *norm_backward_args(shape, dtype, device, transposed))
    report = explain(jfn)
    assert expect in report, report
    return jfn


def plans(trace) -> list:
    """The plans of every fuser region of ``trace``."""
    from thunder_fuser.runtime.region_runner import RegionRunner

    return [p for v in trace.python_ctx().values() if isinstance(v, RegionRunner) for p in v.plans.values()]


def kernel_examples(default: int) -> int:
    """Examples of a property whose every example compiles kernels (0.2-0.8 s each), so
    fewer than the profile's 300: ``KERNEL_EXAMPLES=500`` hunts longer on a GPU."""
    return int(os.environ.get("KERNEL_EXAMPLES", default))


def planned_parts(fn, args) -> list:
    """The kernel parts (program and geometry each) of every segment the torch backend
    plans when ``fn`` is jitted and called on ``args``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_FUSER_KERNELS", "torch")
        jfn = thunder.jit(fn, executors=[fuser_ex])
        jfn(*args)
    return [part for p in plans(thunder.last_traces(jfn)[-1]) for _, k in sorted(p.kernels.items()) if k for part in k.parts]


def compile_planned_kernels_to_ptx(fn, args) -> None:
    """Compile each kernel ``planned_parts`` gives for ``fn`` on ``args`` (CPU tensors) for
    sm_90a (CuTe DSL needs no GPU for that) into a fresh disk cache: a kernel that would
    fail to generate or compile on the GPU, and fall back there, raises here."""
    import tempfile

    from thunder_fuser.backends.cute import segment_kernel

    pytest.importorskip("cutlass")
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
        mp.setenv("CUTE_DSL_ARCH", "sm_90a")
        mp.setenv("THUNDER_FUSER_CACHE", tmp)
        for part in planned_parts(fn, args):
            segment_kernel.compile_program(part.prog, part.geo, None)


def check_kernels_fall_back_only_where_lowering_does(fn, args, check=check_vs_eager) -> None:
    """On the GPU: ``check`` (results and inputs against eager) with the torch backend and
    then with generated kernels, fresh outputs NaN (an unwritten element fails); the
    segments on the reference backend, with their reasons, must be the same both times: a
    kernel that fails to generate or compile would add one."""
    import warnings

    from thunder_fuser.backends.cute import backend, segment_kernel

    def fallbacks(jfn):
        return sorted((i, r) for p in plans(thunder.last_traces(jfn)[-1]) for i, r in p.decision.fallbacks.items())

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_FUSER_KERNELS", "torch")
        lowered = fallbacks(check(fn, *args)[0])
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        mp.setattr(segment_kernel, "FILL_NAN", True)
        backend.forget_warnings()
        warnings.simplefilter("ignore")  # the reference segments warn; compared below
        assert fallbacks(check(fn, *args)[0]) == lowered


def assert_every_segment_ran_a_kernel(jfn) -> None:
    """Forward and backward regions of the last call: no segment ran on the reference backend."""
    for trace in (thunder.last_traces(jfn)[-1], thunder.last_backward_traces(jfn)[-1]):
        _assert_kernels(trace)


def assert_every_segment_ran_a_kernel_forward(jfn) -> None:
    """The regions of the last call (no backward): no segment ran on the reference backend."""
    _assert_kernels(thunder.last_traces(jfn)[-1])


def _assert_kernels(trace) -> None:
    for p in plans(trace):
        assert all(k is not None for i, k in p.kernels.items() if p.decision.kinds[i] != "view"), (p.decision.kinds, p.decision.fallbacks)


STAGED_REDUCTIONS = {  # reduced dims that are runs apart in memory: (fn, input shape at CPU test size)
    "var_mean over N, H and W of NCHW (batch-norm statistics)":
        (lambda x: torch.var_mean(x, dim=(0, 2, 3)), (6, 8, 7, 9)),
    "var with no correction, keepdim": (lambda x: torch.var(x, dim=(0, 2, 3), correction=0, keepdim=True), (6, 8, 7, 9)),
    "sum, amax, amin and mean over dims 0 and 2": (
        lambda x: (x.sum((0, 2)), x.amax((0, 2)), x.amin((0, 2)), x.mean((0, 2))), (5, 12, 33)),
    "a row value computed from the statistics (rstd)": (
        lambda x: torch.rsqrt(torch.var(x, dim=(0, 2, 3), keepdim=True) + 1e-5) * 2, (6, 8, 7, 9)),
    "a full-domain store beside them": (lambda x: (x.sum((0, 2)), x * 2), (5, 12, 33)),
    "a ragged inner run, two kept positions": (lambda x: torch.var_mean(x.float(), dim=(0, 2)), (3, 2, 4097)),
}


def check_batch_norm_backward(device: str, shape, atol=1e-4, memory_format=torch.channels_last):
    """A training-mode ``F.batch_norm``, channels-last unless told: every segment must run a
    kernel."""

    def bn(x, w, b):
        return torch.nn.functional.batch_norm(x, None, None, w, b, training=True)

    x = torch.randn(*shape, device=device).to(memory_format=memory_format)
    check_gradients(bn, x, [torch.randn(shape[1], device=device) for _ in range(2)], atol, require_kernels=True)


def check_a_misaligned_call_runs_a_shared_launch_apart(make) -> None:
    """RoPE's q and k share a launch; a later call whose q is one element off the vector
    alignment (same strides, so the same plan) runs them one by one, q on the reference
    backend, and matches eager; the group stays for aligned calls."""
    from benchmarks.workloads import rope

    q, k, cos, sin = make(1, 4, 8, 16), make(1, 2, 8, 16), make(8, 16), make(8, 16)
    jfn = thunder.jit(rope, executors=[fuser_ex])
    torch.testing.assert_close(jfn(q, k, cos, sin), rope(q, k, cos, sin))
    q_off = make(q.numel() + 1)[1:].view(q.shape)
    torch.testing.assert_close(jfn(q_off, k, cos, sin), rope(q_off, k, cos, sin))
    (plan,) = plans(thunder.last_traces(jfn)[-1])
    assert plan.groups[0] is not None
    torch.testing.assert_close(jfn(q, k, cos, sin), rope(q, k, cos, sin))


def three_shapes(a, x, bias, p, q):
    """Three independent segments: a ragged 1-D tail, a bias read once for 2 rows, a cat along
    the outer dim (pieces picked per row)."""
    return torch.exp(a) * 2, torch.nn.functional.gelu(x + bias, approximate="tanh"), torch.cat((p, q * 2), 0) + 1


def _pad(x, widths, value=0.0):
    return torch.nn.functional.pad(x, widths, value=value)


# cat/pad whose pieces are shifted along two dims, or twice along one: name -> (fn, input shapes)
TWO_LEVEL_RESIZES = {
    "pad of H and W (NCHW)": (lambda x: _pad(x * 2, (8, 8, 2, 3), 1.5), [(2, 3, 5, 64)]),
    "pad of two dims, ragged": (lambda x: _pad(x * 2, (1, 1, 2, 2)), [(64, 33)]),
    "pad of a cat": (lambda x, y: _pad(torch.cat((x, y * 2), -1), (8, 8), -1.0), [(3, 64), (3, 128)]),
    "pad of an outer cat": (lambda x, y: _pad(torch.cat((x, y.exp()), 0), (0, 0, 1, 2)), [(3, 64), (2, 64)]),
    "outer cat of pads": (lambda x, y: torch.cat((_pad(x, (8, 8)), y), 0), [(3, 64), (2, 80)]),
    "one tensor as two pieces": (lambda x: (torch.cat((x, x), -1) + 1, torch.cat((x, x), 0) * 2), [(3, 64)]),
    "reshape of a cat, its dim kept whole": (
        lambda a, b: torch.cat((a, b * 2), -1).reshape(-1, 384) * 3, [(2, 16, 128), (2, 16, 256)]
    ),
    "cat of transposed pieces merged into the cat dim (q/k/v gradients)": (
        lambda dq, dk, dv: _qkv_gradient_cat(dq, dk, dv), [(2, 4, 16, 64), (2, 4, 64, 16), (2, 4, 16, 64)]
    ),
}


def _qkv_gradient_cat(dq, dk, dv):
    """A GPT block's backward joins the q, k, v gradients ([b, h, s, e], k's transposed)
    into the fused projection's: no strided view merges h and e of the transposed pieces
    (``ir/cat_before_reshape.py`` concatenates along h first)."""
    b, h, s, e = dq.shape
    pieces = [t.transpose(1, 2).reshape(b, s, h * e) for t in (dq * 0.5, dk.transpose(-2, -1) * 0.5, dv)]
    return torch.cat(pieces, -1).reshape(b * s, 3 * h * e)


def causal_attention(q, k, v):
    """thunder decomposes this without sdpa_ex: an iota causal mask before the softmax."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def causal_mask(n: int, device):
    i = torch.arange(n, device=device)
    return i[:, None] >= i[None, :]


def causal_mask_scores(s):
    """Attention scores with the future masked out (a mask built from shapes alone)."""
    return s.masked_fill(~causal_mask(s.shape[-1], s.device), float("-inf"))


def _causal_from_arange(s):
    mask = causal_mask(s.shape[-1], s.device)
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1), mask, ~mask.expand(s.shape)


def _tril_of_ones(s):
    n = s.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=s.device).tril()
    return torch.softmax(s.masked_fill(~mask, float("-inf")), -1)


def _constant_outputs(x):
    return (
        x > 0, torch.where(x > 0, x, 0.0), torch.zeros_like(x) + 1, (x > 1) & (x < 2),
        torch.arange(7, device=x.device) * 2, torch.full_like(x, 3.0), torch.arange(x.shape[0], device=x.device),
    )


# iota and full inside kernel segments (``backends/cute/lower/constants.py``): fn, input shapes
CREATION_CASES = {
    "causal mask from arange (softmax; the mask and its negation returned)": (_causal_from_arange, [(2, 4, 100, 100)]),
    "tril of ones (full, bitwise and/not)": (_tril_of_ones, [(2, 3, 37, 37)]),
    "bool and constant outputs (where, zeros_like + 1, full_like, arange)": (_constant_outputs, [(33, 1000)]),
}


def integer_division(a, b):
    """thunder's integer div truncates; floor division adds signbit, fmod and a correction."""
    return torch.div(a, b, rounding_mode="trunc"), a // b, (a // 3) * 2


def signed_operands(shape, dtype, device="cpu"):
    """Integers of both signs, and divisors of both signs that are never zero."""
    a = torch.randint(-1000, 1000, shape, dtype=dtype, device=device)
    b = torch.randint(1, 50, shape, dtype=dtype, device=device)
    return a, b * (torch.randint(0, 2, shape, dtype=dtype, device=device) * 2 - 1)


def ptx_text(fn) -> str:
    """A compiled kernel's PTX text (CuTe DSL gives the file's path when it was dumped to a
    folder of our choosing)."""
    from thunder_fuser.backends.cute import cache

    ptx = cache.compiled_object(fn).artifacts.PTX
    return Path(ptx).read_text() if ptx.endswith(".ptx") and Path(ptx).is_file() else ptx


def rope_from_one_projection(cos, sin, qkv):
    """litgpt's attention inputs as one graph: q, k and v sliced from one projection, RoPE
    over their heads with cos and sin sliced from the model's buffers, k and v repeated per
    query head; the expanded views returned as a forward saves them for its backward."""
    def rot(x):
        return torch.cat([-x[..., 8:], x[..., :8]], -1)

    q, k, v = qkv.split([64, 32, 32], -1)
    q, k, v = (t.reshape(2, 32, -1, 16).transpose(1, 2) for t in (q, k, v))
    c, s = cos[:32].reshape(1, 1, 32, 16), sin[:32].reshape(1, 1, 32, 16)
    cq, sq, ck, sk = c.expand(2, 4, 32, 16), s.expand(2, 4, 32, 16), c.expand(2, 2, 32, 16), s.expand(2, 2, 32, 16)
    qr = torch.cat([q * cq + rot(q) * sq, q[..., :0]], -1)
    kr = torch.cat([k * ck + rot(k) * sk, k[..., :0]], -1)
    return (qr, kr[:, :, None].expand(2, 2, 2, 32, 16).reshape(2, 4, 32, 16),
            v[:, :, None].expand(2, 2, 2, 32, 16).reshape(2, 4, 32, 16), cq, sq, ck, sk)


# programs whose outputs are bools, one per kernel family that stores them (a row's value, a
# row's vectors, a resize, a transposed store, a ragged tail): each bool must be torch's byte
BOOL_STORES = {
    "pointwise": (lambda x: x > 0, lambda: (torch.randn(64, 256),)),
    "pointwise ragged 1-D": (lambda x: x > 0, lambda: (torch.randn(1001),)),
    "transposed": (lambda x: x.t() > 0, lambda: (torch.randn(64, 256),)),
    "row values": (lambda x: x.amax(1) > 0, lambda: (torch.randn(64, 256),)),
    "row vectors": (lambda x: (x - x.amax(1, keepdim=True)) > -1, lambda: (torch.randn(64, 256),)),
    "resize": (lambda a, b: torch.cat([a > 0, b > 0], 1), lambda: (torch.randn(64, 256), torch.randn(64, 128))),
    "a loss's mask and count": (lambda t: (t != -100, (t != -100).float().sum()),
                                lambda: (torch.randint(-1, 3, (32,)),)),
}
