"""The model zoo: whole training steps of the models users train, optimizer in the loop.

    python -m benchmarks.zoo [--models Llama-3.2-1B,phi-2] [--contenders ...] [--tiny]

Each model is somebody else's code (litgpt configs, transformers models built from configs:
``model_zoo.py``) at its real width and at its full depth, or at the depth ``ZOO`` gives where
one GPU cannot hold every contender of it at once (each contender keeps its parameters,
gradients and AdamW's two moments, all bf16). A step is what a training loop runs: the
forward with the loss, the backward, torch's AdamW step (``fused=True``) and
``zero_grad(set_to_none=True)``, over ``--batch`` x ``--seq`` tokens (4096 by default).

Contenders, every one in this process (the default six; ZOO's depths hold six at once): eager,
torch.compile (the model; torch's fused AdamW), ``torch.compile+step`` (the model and
``torch.compile(opt.step)``, foreach AdamW through Inductor), thunder with the
torch.compile executor, thunder + fuser (the README's recommended call; torch's fused
AdamW) and ``thunder+fuser+jitstep``: the same with the optimizer's step through us too,
``thunder.jit(opt.step, executors=thunder_fuser.executors())``, the README's call. By
``--contenders`` also: thunderfx + fuser (the model through ThunderFX with our executors)
and ``thunder+fuser+step``: thunder + fuser with the step through ThunderFX and our
executors (``torch.compile(opt.step, backend=ThunderCompiler(executors=...))``).

Before any timing each contender's first step is checked against eager's from the same
weights: the loss, every gradient, and every parameter's update by the optimizer. An update
is off beyond two units in the last place of the weight and 5% of itself (AdamW's first step
moves a weight by about the learning rate, half a bf16 ulp of a weight of 0.25: a norm of the
update's error would measure roundings, not the step), and beyond what its gradient's
difference from eager's moves it. The contenders are then timed in interleaved turns
(``models.time_interleaved``), so a contender that needs the allocator to hand back the same
addresses shows it; after the turns each is checked again (``models.check_after_turns``).
Per contender: the step's time, tokens/s, its steps alone in the process after its warm-up
(``alone ms``: a contender slower in turns than alone depends on what ran between its
steps), peak and held memory, the first step's seconds, and one profiled step's GPU time by
kind of kernel (``kernel_kinds``): matmuls, attention, our kernels, the optimizer's,
Triton's, and every other torch kernel by name (what our regions left outside), and where
the GPU waited between kernels (``idle_gaps``).

``--buckets 512,1024,...`` also steps each contender over those sequence lengths in turns,
against each length alone, and counts what the turns built again (``benchmarks/buckets.py``).

``--tiny`` runs the same harness on the CPU with tiny configs in fp32 (its timings mean nothing).
Writes ``zoo-<model>.json`` per model into ``--out`` and prints a table last.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
import traceback
import warnings

import torch

from benchmarks import cli
from benchmarks.buckets import bucketed
from benchmarks.contenders import run_label, wrap
from benchmarks.model_zoo import batch, build
from benchmarks.models import (
    GiB,
    _check,
    _device,
    _device_and_dtype,
    _fallbacks,
    _sync,
    check_after_turns,
    contender_model,
    graph_pools,
    our_warnings,
    release,
    run_config,
    time_interleaved,
    with_pools,
)

# model -> (layers run, its full depth): full depth where the H200 (141 GB) holds every
# contender at once at 4096 tokens a step, else cut, never below 8
ZOO = {
    "Llama-3.2-1B": (16, 16), "Llama-3.2-3B": (14, 28), "Mistral-7B-v0.1": (8, 32), "phi-2": (16, 32),
    "Phi-3-mini-4k-instruct": (10, 32), "Gemma-2-2b": (12, 26), "Qwen2.5-1.5B": (28, 28), "OLMo-1B-hf": (16, 16),
    "falcon-7b": (8, 32), "stablelm-3b-4e1t": (12, 32), "pythia-1b": (16, 16), "pythia-410m": (24, 24),
    "hf-Llama": (16, 16), "hf-Qwen2": (24, 24), "hf-Mistral": (8, 32), "hf-Phi3": (10, 32), "hf-Gemma2": (12, 26),
    "hf-GPT2": (12, 12), "hf-ViT": (12, 12),
}
TINY_MODELS = ("Llama-3.2-1B", "hf-GPT2")
# the default set: six, the count ZOO's depths were chosen to hold at once
CONTENDERS = ("eager", "torch.compile", "torch.compile+step", "thunder+torchcompile", "thunder+fuser",
              "thunder+fuser+jitstep")
MORE_CONTENDERS = ("thunder+fuser+step", "thunderfx+fuser")  # by --contenders
STEP_SUFFIXES = ("+step", "+jitstep")  # the optimizer's step compiled too (``compiled_step``)
LR, WEIGHT_DECAY = 1e-3, 0.1
# a weight's first update against eager's: off when beyond 2 ulps of the weight and 5% of the
# update and what the gradient's own difference explains (``_gradient_slack``); a step is
# wrong when more than UPDATE_OFF of a parameter's elements are off
UPDATE_REL, UPDATE_OFF = 5e-2, 1e-2
ALONE_STEPS = 5  # each contender's steps alone in the process, after its warm-up


def compiled_step(step, model_kind: str, suffix: str):
    """The optimizer's ``step`` as a contender compiles it: ``+step``, by the model's own
    compiler (Inductor for torch.compile, ThunderFX with our executors for thunder + fuser);
    ``+jitstep``, by ``thunder.jit`` with our executors (the README's call)."""
    if suffix == "+step" and model_kind.startswith("torch.compile"):
        return torch.compile(step)
    import thunder

    import thunder_fuser

    if suffix == "+jitstep":
        return thunder.jit(step, executors=thunder_fuser.executors())
    from thunder.dynamo import ThunderCompiler

    return torch.compile(step, backend=ThunderCompiler(executors=thunder_fuser.executors()))


class Trainer:
    """One contender's model, optimizer and step."""

    def __init__(self, kind: str, module: torch.nn.Module):
        self.kind, self.module = kind, module
        suffix = next((x for x in STEP_SUFFIXES if kind.endswith(x)), None)
        model_kind = kind.removesuffix(suffix) if suffix else kind
        self.fn = wrap(model_kind, module)
        # a step compiled too is torch's foreach AdamW, not its fused one
        self.opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, fused=suffix is None)
        self.opt_step = self.opt.step if suffix is None else compiled_step(self.opt.step, model_kind, suffix)

    def forward_backward(self, idx, targets):
        loss = self.fn(idx, targets)
        loss.backward()
        return loss.detach()

    def step(self, idx, targets):
        """One training step: forward and backward, the optimizer's step, zeroed gradients."""
        loss = self.forward_backward(idx, targets)
        self.opt_step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def time_steps(self, idx, targets, n: int) -> list[float]:
        times = []
        for _ in range(n):
            if torch.cuda.is_available():
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                self.step(idx, targets)
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            else:
                t0 = time.perf_counter()
                self.step(idx, targets)
                times.append((time.perf_counter() - t0) * 1000)
        return times


def _host(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` on the host in fp32 (never ``t`` itself, which a step then changes)."""
    return t.detach().to("cpu", torch.float32, copy=True)


def _update_error(module, before: list, ref_updates: list, ref_grads: list | None = None) -> str | None:
    """None when every parameter moved as eager's optimizer moved it (``UPDATE_OFF``), else
    the parameter with the most elements off. ``before``: the parameters before the step;
    ``ref_grads``: eager's gradients, beside which the contender's (still held) let its
    update stray as far as its gradient's difference explains (``_gradient_slack``). Each
    parameter is compared where it lives, one at a time (a host pass over every element of
    a 1.5B model took tens of seconds per contender)."""
    worst = (0.0, "")
    with torch.no_grad():
        for i, ((name, p), b, want) in enumerate(zip(module.named_parameters(), before, ref_updates)):
            b, want = b.to(p.device, torch.float32), want.to(p.device, torch.float32)
            allowed = 2 * torch.finfo(p.dtype).eps * b.abs() + UPDATE_REL * want.abs() + 1e-30
            if ref_grads is not None:
                allowed += _gradient_slack(p.grad, ref_grads[i].to(p.device))
            off = (p.float() - b - want).abs() > allowed
            worst = max(worst, (off.float().mean().item(), name))
    if worst[0] > UPDATE_OFF:
        return f"the optimizer's update of {worst[1]}: {worst[0]:.1%} of its elements off"
    return None


def _gradient_slack(grad: torch.Tensor, ref_grad: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """How far AdamW's first update of a parameter may differ from eager's because its
    gradient differs: the update is ``lr * g / (|g| + eps)``, which moves by at most
    ``lr * |dg| / (|g| + eps)`` (twice that covers a gradient near zero of the other sign)."""
    g = ref_grad.float()
    return 2 * LR * (grad.float() - g).abs() / (g.abs() + eps)


KINDS = (
    # a CuTe DSL kernel: ``kernel_cutlass_<function>_<its operands>``, whatever the function
    # (``kernel``, a column reduction's ``partial`` and ``finalize``); cuBLAS's own CUTLASS
    # kernels are named ``cutlass3x_...``, ``sm90_xmma_...``
    ("ours", ("kernel_cutlass_",)),
    # before the matmuls: FlashAttention's and the memory-efficient kernels' names hold
    # ``cutlass`` (``pytorch_flash::flash_bwd_..._kernel<..., cutlass::bfloat16_t>``)
    ("attention", ("flash", "fmha", "attention", "sdpa", "mha")),
    ("matmul", ("gemm", "nvjet", "xmma", "cublas", "cutlass", "splitk")),
    # cuDNN's attention names hold ``sdpa`` (above); its other kernels come after the
    # matmuls, so that a convolution's ``..._xmma_...gemm`` stays a matmul
    ("attention", ("cudnn",)),
    ("optimizer", ("multi_tensor_apply", "fused_adam", "adam")),
    ("triton", ("triton",)),
)


# the rule above, as a run records it: runs without it counted a column reduction's two
# kernels of ours (``kernel_cutlass_partial``, ``_finalize``) as matmuls
KINDS_BY = "every kernel_cutlass_ ours"


# why a torch kernel runs outside our regions, by a mark in its name; a kernel none of these
# names is reported as unexplained (a copy or an elementwise op is one of ours to take)
EMBEDDING_BACKWARD = ("the embedding's backward (aten.embedding_backward): rows summed by token id, sorted "
                      "first; no kernel family of ours scatters")
LEFT_OUTSIDE = (
    (("sum_and_scatter", "compute_grad_weight", "radix_sort", "unique_by_key", "krn_partial", "DeviceScan",
      "vectorized_gather", "DeviceRadixSort", "compute_num_of_partial_segments"), EMBEDDING_BACKWARD),
    (("Memset",), "a driver memset (cuBLAS's and cuDNN's workspaces, the embedding backward's counts)"),
)


# why, by the torch op that launched it (``launching_ops``): a fill or a copy is ours to take
# unless the op that makes it is one no kernel of ours runs
LEFT_OUTSIDE_BY_OP = (
    (("aten::embedding_backward", "aten::embedding_dense_backward"),
     "the embedding's backward (aten.embedding_backward): its [vocabulary, dim] gradient zeroed before the "
     "rows are scattered into it; no kernel family of ours scatters"),
    (("aten::ones_like",), "autograd's seed of the loss's gradient (a one-element ones_like in backward())"),
    # hf-ViT's patch embedding on the H100: 3 elementwise copies under aten::convolution, 0.045 ms
    (("aten::convolution", "aten::convolution_backward"),
     "a convolution's own conversions of its operands to the layout cuDNN runs, inside torch's op (no kernel "
     "family of ours convolves)"),
)


# a kernel in a CUDA graph has no launching op (the host only replays the graph): one that
# runs among an op's own kernels, with no kernel but torch's between, is that op's. H200,
# Llama-3.2-1B's embedding backward in a graph: an arange, memsets, the radix sort, the
# [vocabulary, dim] gradient's bf16 fill, cub's compaction init, unique_by_key, the scans,
# compute_grad_weight, sum_and_scatter, nothing of ours between. A copy never inherits a
# reason this way (a copy is ours to take).
INHERITS_IN_A_RUN = (EMBEDDING_BACKWARD,)


def runs_explained(names: list, whys: list) -> list:
    """``whys`` (one per torch kernel of a step, in launch order; None marks a kernel of
    another kind, which ends a run) with each unexplained kernel that is no copy given the
    reason of its run of torch kernels, where every explained kernel of the run (memsets
    aside) has one reason of ``INHERITS_IN_A_RUN`` and the kernel runs before the last of
    them."""
    out = list(whys)
    start = 0
    while start < len(whys):
        if whys[start] is None:
            start += 1
            continue
        end = start
        while end < len(whys) and whys[end] is not None:
            end += 1
        reasons = {w for w, n in zip(whys[start:end], names[start:end]) if w != "unexplained" and "Memset" not in n}
        last = max((i for i in range(start, end) if whys[i] in reasons), default=-1)
        if len(reasons) == 1 and reasons <= set(INHERITS_IN_A_RUN):
            reason = next(iter(reasons))
            for i in range(start, last):
                if out[i] == "unexplained" and "copy" not in names[i].lower():
                    out[i] = reason
        start = end
    return out


def left_outside_why(name: str, op: str = "") -> str:
    """Why a torch kernel runs outside our regions (``op``: the outermost torch op that
    launched it, where the profiler tells), or "unexplained"."""
    return next((why for marks, why in LEFT_OUTSIDE if any(m in name for m in marks)), None) or next(
        (why for marks, why in LEFT_OUTSIDE_BY_OP if op in marks), "unexplained")


def launching_ops(prof) -> dict:
    """Kernel name -> the outermost ``aten::`` op above each host call that launched one,
    in launch order, for the kernels the profiler ties to a host op (none in a CUDA graph)."""
    ops = {}
    for fe in prof.events():
        if fe.device_type != torch.autograd.DeviceType.CPU or not fe.kernels:
            continue
        outer, e = None, fe
        while e is not None:
            if e.name.startswith("aten::"):
                outer = e.name
            e = e.cpu_parent
        for k in fe.kernels:
            ops.setdefault(k.name, []).append(outer or "")
    return ops


def kernel_kind(name: str) -> str:
    """What a GPU kernel is, by its name: one of ``KINDS``, else ``torch``."""
    low = name.lower()
    return next((kind for kind, marks in KINDS if any(m in low for m in marks)), "torch")


# the op group a fused kernel (ours or Inductor's) computes, by the ops its name lists: ours
# ``fuser_<family>_<ops>_kernel_cutlass_...`` (``kernel_names.py``), Inductor's
# ``triton_<kind>_fused_<aten ops>_<n>``; the first group that matches, else "other"
OP_GROUPS = (
    ("loss", lambda w, t: any(m in t for m in ("log_softmax", "nll_loss", "logsumexp", "cross_entropy"))
     or {"log", "exp"} <= w),
    ("softmax", lambda w, t: "softmax" in t or {"exp", "amax"} <= w),
    # a norm's forward (its rsqrt) and backward (the rsqrt's derivative: a pow, summed per row)
    ("norm", lambda w, t: "rsqrt" in w or {"var", "mean"} <= w or {"pow", "sum"} <= w or "layer_norm" in t),
    ("activation", lambda w, t: bool(w & {"silu", "sigmoid", "gelu", "tanh", "erf", "relu"})
     or {"exp", "reciprocal"} <= w),
    ("optimizer", lambda w, t: "lerp" in w or "foreach" in t or {"sqrt", "div"} <= w),
    ("rope", lambda w, t: bool(w & {"cat", "neg"})),
    ("embedding", lambda w, t: "embedding" in t),
)


def op_group(name: str) -> str:
    """What a fused kernel computes (``OP_GROUPS``), from its name."""
    if name.startswith("fuser_"):
        text = name.split("_kernel_cutlass_")[0][len("fuser_"):]
    elif name.startswith("triton_"):
        text = name.split("fused_", 1)[-1]
    else:
        return "other"
    words = set(text.split("_"))
    return next((group for group, test in OP_GROUPS if test(words, text)), "other")


def fused_name(name: str) -> str:
    """A fused kernel's name without what varies with its operands: ours up to the DSL's
    ``_kernel_cutlass_<function>``, Inductor's whole (its names are short)."""
    head, sep, rest = name.partition("_kernel_cutlass_")
    return head + sep + rest.split("_")[0] if sep else name[:120]


def kernel_kinds(prof, launched_by: dict | None = None) -> dict:
    """GPU ms of a profiled step by kind of kernel, and the torch kernels by name;
    ``launched_by``: ``launching_ops`` of a step profiled with its host ops (default: of
    ``prof``, which then needs them)."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    launched_by = {k: list(v) for k, v in (launching_ops(prof) if launched_by is None else launched_by).items()}
    ms: dict[str, float] = {}
    torch_kernels: dict[tuple, list] = {}
    groups: dict[str, dict] = {}  # op group -> kind (ours, triton) -> ms
    fused: dict[str, list] = {}  # a fused kernel's name without its operands -> [calls, ms]
    matmuls: dict[str, list] = {}  # a matmul kernel's name (cuBLAS's tile and layout) -> [calls, ms]
    in_order: list = []  # (kernel, its launching op, why) in launch order; None for kernels not torch's
    for e in sorted(kernels, key=lambda e: e.time_range.start):
        kind = kernel_kind(e.name)
        ms[kind] = ms.get(kind, 0.0) + e.device_time / 1e3
        if kind in ("ours", "triton"):
            by_kind = groups.setdefault(op_group(e.name), {})
            by_kind[kind] = by_kind.get(kind, 0.0) + e.device_time / 1e3
            hit = fused.setdefault(fused_name(e.name), [0, 0.0])
            hit[0] += 1
            hit[1] += e.device_time / 1e3
        if kind == "matmul":
            hit = matmuls.setdefault(e.name[:120], [0, 0.0])
            hit[0] += 1
            hit[1] += e.device_time / 1e3
        if kind == "torch":
            by = launched_by.get(e.name)
            op = by.pop(0) if by else ""
            in_order.append((e, op, left_outside_why(e.name, op)))
        else:
            in_order.append((e, None, None))
    whys = runs_explained([e.name for e, _, _ in in_order], [w for _, _, w in in_order])
    for (e, op, _), why in zip(in_order, whys):
        if why is not None:
            hit = torch_kernels.setdefault((e.name[:160], op, why), [0, 0.0])
            hit[0] += 1
            hit[1] += e.device_time / 1e3
    left = sorted(torch_kernels.items(), key=lambda kv: -kv[1][1])
    return {"kernels_per_step": len(kernels), "gpu_ms": round(sum(e.device_time for e in kernels) / 1e3, 3),
            "kinds_by": KINDS_BY,
            "gpu_ms_by_kind": {k: round(v, 3) for k, v in sorted(ms.items())},
            "gpu_ms_by_group": {g: {k: round(v, 3) for k, v in sorted(kinds.items())} for g, kinds in sorted(groups.items())},
            "fused_kernels": [{"name": n, "group": op_group(n), "calls": c, "ms": round(t, 3)}
                              for n, (c, t) in sorted(fused.items(), key=lambda kv: -kv[1][1])[:40]],
            # the same matmuls in two contenders take the same cuBLAS kernels (H200, Llama-3.2-3B at 2
            # layers: torch.compile's and ours alike); a matmul column apart says which ran longer
            "matmul_kernels": [{"name": n, "calls": c, "ms": round(t, 3)}
                               for n, (c, t) in sorted(matmuls.items(), key=lambda kv: -kv[1][1])[:20]],
            "torch_kernels": [{"name": n, "op": op, "calls": c, "ms": round(t, 3), "why": why}
                              for (n, op, why), (c, t) in left[:20]],
            **idle_gaps([(e.time_range.start, e.time_range.end, e.name) for e in kernels])}


def idle_gaps(spans: list, top: int = 8) -> dict:
    """Where the GPU waited within a step: the idle microseconds between the first kernel's
    start and the last one's end, and the longest waits with the kernels around them (a wait
    after a kernel is the host behind: a sync, or launches slower than the GPU runs them).
    ``spans``: (start us, end us, kernel name)."""
    if not spans:
        return {"gpu_idle_ms": 0.0, "idle_gaps": []}
    spans = sorted(spans)
    gaps = []
    end, last = spans[0][1], spans[0][2]
    for start, stop, name in spans[1:]:
        if start > end:
            gaps.append((start - end, last, name))
        if stop > end:
            end, last = stop, name
    gaps.sort(key=lambda g: -g[0])
    return {"gpu_idle_ms": round(sum(g[0] for g in gaps) / 1e3, 3),
            "idle_gaps": [{"us": round(us, 1), "after": a[:100], "before": b[:100]} for us, a, b in gaps[:top]]}


def _profile(trainer: Trainer, idx, targets) -> dict:
    from torch.profiler import ProfilerActivity, profile

    # the host ops that launch each kernel come from a step of their own: recording them
    # slows the host and would widen the GPU's idle gaps in the step that is measured
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as with_ops:
        trainer.step(idx, targets)
        torch.cuda.synchronize()
    launched_by = launching_ops(with_ops)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        trainer.step(idx, targets)
        torch.cuda.synchronize()
    return kernel_kinds(prof, launched_by)


def _first_step(trainer: Trainer, ref: dict, res: dict) -> str | None:
    """The contender's first step, its compiles included, against eager's: None, or what
    differs (the loss or a gradient, then a parameter's update). Its seconds go to ``res``."""
    module, (idx, targets) = trainer.module, ref["batch"]
    _sync()
    t0 = time.perf_counter()
    loss = trainer.forward_backward(idx, targets)
    _sync()
    res["first_call_s"] = round(time.perf_counter() - t0, 2)
    bad = _check(module, loss, ref["loss"], ref["grads"])
    if bad:
        return bad
    before = [p.detach().clone() for p in module.parameters()]  # where they live: the check runs there
    t0 = time.perf_counter()
    trainer.opt_step()
    _sync()
    res["first_optimizer_step_s"] = round(time.perf_counter() - t0, 2)
    bad = _update_error(module, before, ref["updates"], ref["grads"])
    del before
    trainer.opt.zero_grad(set_to_none=True)
    return bad


def run_contender(kind: str, name: str, layers: int, ref: dict, tiny: bool, timers: list, checks: list,
                  buckets: tuple = ()) -> dict:
    """One contender: its first step checked, its memory and a profiled step; its timing
    (``timers``) and its check after the timed turns (``checks``) for ``run_model``;
    ``buckets``: sequence lengths its steps also take in turns (``benchmarks/buckets.py``)."""
    built, others, pools_before = contender_model(name, layers, ref, tiny)
    module = built.module
    idx, targets = ref["batch"]
    res: dict = {"error": None}
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = Trainer(kind, module)
            bad = _first_step(trainer, ref, res)
            if bad:
                res["error"] = f"wrong result: {bad}"
                return res
            for _ in range(3):  # the kernels compiled in workers arrive; graphs are captured
                trainer.step(idx, targets)
            _sync()
            # its steps alone in the process, against its steps in turns with the others
            res["step_ms_alone"] = round(statistics.median(trainer.time_steps(idx, targets, ALONE_STEPS)), 3)
            if buckets:
                res["buckets"] = bucketed(trainer.time_steps, trainer.fn,
                                          {n: batch(built, idx.shape[0], n, device=idx.device) for n in buckets})
        if torch.cuda.is_available():
            gc.collect()
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - others
            res["held_GiB"] = round(with_pools(held, pools_before, graph_pools(torch.cuda.memory_snapshot())) / GiB, 3)
            torch.cuda.reset_peak_memory_stats()
            trainer.step(idx, targets)
            torch.cuda.synchronize()
            res["peak_GiB"] = round((torch.cuda.max_memory_allocated() - others) / GiB, 3)
            res.update(_profile(trainer, idx, targets))
        if "fuser" in kind:
            res["fallbacks"] = _fallbacks(trainer.fn)
        res["warnings"] = our_warnings(caught)
        timers.append((res, lambda n: trainer.time_steps(idx, targets, n)))

        def again():
            """Eager's first step again, from the reference weights loaded in place (the
            addresses every graph was captured at stay)."""
            with torch.no_grad():
                module.load_state_dict(ref["state"])
            trainer.opt.zero_grad(set_to_none=True)
            loss = trainer.forward_backward(idx, targets)
            _sync()
            return _check(module, loss, ref["loss"], ref["grads"])

        checks.append((res, again))
    except Exception as e:  # noqa: BLE001 - a failing contender is reported, never dropped
        res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        traceback.print_exc()
    return res


def reference(name: str, layers: int, batch_size: int, seq: int, tiny: bool, longest: int | None = None
              ) -> tuple[dict, dict]:
    """Eager's first step from the model's initial weights: the loss, the gradients and each
    parameter's update by torch's fused AdamW, kept on the host; ``longest``: the longest
    sequence any step takes (``model_zoo.litgpt_config``), every contender's model built so."""
    device, dtype = _device_and_dtype(tiny)
    built = build(name, layers, tiny=tiny, device=device, dtype=dtype, longest=longest)
    idx, targets = batch(built, batch_size, seq, device=device)
    state = {k: v.detach().to("cpu", copy=True) for k, v in built.module.state_dict().items()}
    loss = built.module(idx, targets)
    loss.backward()
    grads = [p.grad.detach().cpu() for p in built.module.parameters()]
    before = [_host(p) for p in built.module.parameters()]
    torch.optim.AdamW(built.module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, fused=True).step()
    updates = [_host(p) - b for p, b in zip(built.module.parameters(), before)]
    config = run_config(built, batch_size, seq)
    del built
    release()
    return {"state": state, "batch": (idx, targets), "loss": loss.detach().cpu(), "grads": grads, "longest": longest,
            "updates": updates}, config


def added_run(before: dict, run: dict) -> dict:
    """``before`` (a model's JSON) with ``run``'s contenders added, each marked with the run
    it came from (a contender run again is replaced; the first run's torch.compile stays the
    one the table lists, every contender's x torch.compile is against its own run's)."""
    if (before["layers"], before["config"]) != (run["layers"], run["config"]):
        raise SystemExit(f"--add: {run['name']} ran with other layers or sizes than {before['layers']} ({before['config']})")
    n = 1 + max((c.get("run", 1) for c in before["contenders"].values()), default=0)
    merged = dict(before, contenders=dict(before["contenders"]))
    # a run on another GPU than the JSON's: its contenders carry the GPU it ran on
    elsewhere = {} if run.get("device") == before.get("device") else {"device": run.get("device")}
    for label, c in run["contenders"].items():
        if label == "torch.compile" and label in merged["contenders"]:
            label = f"torch.compile (run {n})"
        merged["contenders"][label] = dict(c, run=n, **elsewhere)
    return merged


def run_model(name: str, contenders, layers: int, batch_size: int, seq: int, steps: int, tiny: bool,
              buckets: tuple = (), partial: str | None = None) -> dict:
    full = ZOO.get(name, (layers, layers))[1]
    ref, config = reference(name, layers, batch_size, seq, tiny, max((seq, *buckets)))
    out = {"name": name, "layers": layers, "full_depth": full, "config": config, "contenders": {}}
    timers: list = []
    checks: list = []
    try:
        for kind in contenders:
            label = run_label(kind, out["contenders"])
            print(f"[{name}] {label} ...", flush=True)
            began = time.perf_counter()
            r = out["contenders"][label] = run_contender(kind, name, layers, ref, tiny, timers, checks, buckets)
            # a call with a time limit shows where its time went even when the turns never end
            print(f"[{name}] {label}: set up in {time.perf_counter() - began:.0f} s (first call "
                  f"{r.get('first_call_s')} s){', ' + r['error'][:200] if r.get('error') else ''}", flush=True)
            if partial:  # what a call cut short by its time limit still brings back
                with open(partial, "w") as f:
                    json.dump({**out, "partial": "contenders set up; turns not timed"}, f, indent=1)
        time_interleaved(timers, steps, batch_size, seq)
        check_after_turns(checks)
    finally:
        timers.clear()
        checks.clear()
        release()
        torch._dynamo.reset()
    base = out["contenders"].get("torch.compile", {}).get("step_ms")
    for label, r in out["contenders"].items():
        if base and r.get("step_ms"):
            r["x_torch_compile"] = round(base / r["step_ms"], 3)
        if r.get("step_ms") and r.get("step_ms_alone"):
            r["x_alone"] = round(r["step_ms"] / r["step_ms_alone"], 3)
        print(f"[{name}] {label}: " + json.dumps({k: v for k, v in r.items() if k != "torch_kernels"}), flush=True)
    return out


def shown_label(label: str, c: dict) -> str:
    """A contender's name, with the run it came from where a later run added it (``--add``),
    and the GPU of a run on another GPU than the model's first."""
    n = c.get("run", 1)
    if n == 1:
        return label
    gpu = f", {c['device'].split(';')[0].replace('NVIDIA ', '')}" if c.get("device") else ""
    if f"(run {n})" in label:  # a later run's torch.compile: its label names the run already
        return label.replace(f"(run {n})", f"(run {n}{gpu})")
    return f"{label} (run {n}{gpu})"


def table(results: list) -> str:
    lines = ["| model | layers (full) | contender | step ms | alone ms | x torch.compile | tokens/s | GPU ms | GPU idle ms | matmul | attention "
             "| ours | optimizer | triton | torch | peak GiB | held GiB | first call s | error |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | --- |"]
    for r in results:
        for label, c in r["contenders"].items():
            kinds = c.get("gpu_ms_by_kind", {})
            lines.append("| " + " | ".join(str(x) for x in (
                r["name"], f"{r['layers']} ({r['full_depth']})", shown_label(label, c), c.get("step_ms", ""),
                c.get("step_ms_alone", ""),
                c.get("x_torch_compile", ""), c.get("tokens_per_s", ""), c.get("gpu_ms", ""), c.get("gpu_idle_ms", ""),
                *(kinds.get(k, "") for k in ("matmul", "attention", "ours", "optimizer", "triton", "torch")),
                c.get("peak_GiB", ""), c.get("held_GiB", ""), c.get("first_call_s", ""),
                (c.get("error") or "")[:120])) + " |")
    return "\n".join(lines)


def short_kernel_name(name: str) -> str:
    """What a torch kernel does, from its C++ name: its functor (``direct_copy_kernel_cuda``,
    ``FillFunctor<c10::BFloat16>``), else its function's name."""
    import re

    for pattern in (r"direct_copy_kernel_cuda", r"\w+Functor(<[\w:, ]*>)?", r"CatArray\w*"):
        m = re.search(pattern, name)
        if m:
            return m.group(0)
    head = name.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0]
    return head.split("::")[-1].replace("void ", "").strip() or name[:60]


def outside_table(results: list, contender: str = "thunder+fuser") -> str:
    """Per model, the torch kernels ``contender``'s step ran outside our regions, and why;
    empty where none was profiled."""
    lines = ["| model | kernel | launched by | calls | ms | why outside our regions |",
             "| --- | --- | --- | ---: | ---: | --- |"]
    for r in results:
        for k in r["contenders"].get(contender, {}).get("torch_kernels", []):
            lines.append(f"| {r['name']} | `{short_kernel_name(k['name'])}` | {k.get('op', '')} | {k['calls']} | {k['ms']} | "
                         f"{k.get('why') or left_outside_why(k['name'], k.get('op', ''))} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def group_table(results: list, ours: str = "thunder+fuser", theirs: str = "torch.compile") -> str:
    """Per model and op group (``OP_GROUPS``), the GPU ms of ``ours``' kernels beside
    Inductor's in ``theirs`` of the same run (``added_run``: a later run's torch.compile is
    ``torch.compile (run n)``, maybe on another GPU); empty where no run named its kernels by
    their ops."""
    lines = ["| model | op group | ours ms | Triton ms | ours x Triton |", "| --- | --- | ---: | ---: | ---: |"]
    for r in results:
        mine = r["contenders"].get(ours, {})
        n = mine.get("run", 1)
        a = mine.get("gpu_ms_by_group")
        b = r["contenders"].get(theirs if n == 1 else f"{theirs} (run {n})", {}).get("gpu_ms_by_group")
        if not a or not b:
            continue
        for g in sorted(set(a) | set(b)):
            x, y = a.get(g, {}).get("ours", 0.0), b.get(g, {}).get("triton", 0.0)
            lines.append(f"| {r['name']} | {g} | {x:.3f} | {y:.3f} | {f'{x / y:.2f}' if x and y else ''} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def bucket_table(results: list) -> str:
    """Per model, contender and length: the bucketed run (``benchmarks/buckets.py``); empty
    where no model ran one."""
    lines = ["| model | contender | length | first step s | fixed ms | in turns ms | x fixed | built again in the turns |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        for label, c in r["contenders"].items():
            b = c.get("buckets")
            if not b:
                continue
            again = ", ".join(f"{k} {v}" for k, v in b["rebuilt"].items() if v) or "nothing"
            for n, row in b["lengths"].items():
                lines.append(f"| {r['name']} | {label} | {n} | {row['first_s']} | {row['fixed_ms']} | "
                             f"{row.get('turns_ms', '')} | {row.get('x_fixed', '')} | {again} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def report(results: list) -> str:
    """What a run prints last: the table, the bucketed lengths' (where run), the geometric mean."""
    return "\n".join(x for x in (table(results), bucket_table(results), geometric_mean_line(results)) if x)


def geometric_mean_line(results: list) -> str:
    """thunder + fuser's (and with the optimizer's step through us) step against
    torch.compile's, as a geometric mean over the models where both ran."""
    parts = []
    for kind in ("thunder+fuser", "thunder+fuser+step", "thunder+fuser+jitstep"):
        xs = [x for r in results if (x := r["contenders"].get(kind, {}).get("x_torch_compile"))]
        if xs:
            parts.append(f"{kind} x torch.compile, geometric mean over {len(xs)} models: "
                         f"{statistics.geometric_mean(xs):.3f}")
    return "; ".join(parts)


def main(argv=None) -> None:
    ap = cli.parser("benchmarks.zoo", __doc__, epilog=(
        "models (layers run, full depth): " + ", ".join(f"{m} ({a}, {b})" for m, (a, b) in ZOO.items())
        + f"\ncontenders: {', '.join(CONTENDERS)} (default); {', '.join(MORE_CONTENDERS)}"))
    ap.add_argument("--out", default="benchmarks/results", help="folder for zoo-<model>.json")
    ap.add_argument("--models", help=f"comma-separated (default: all; with --tiny {','.join(TINY_MODELS)})")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated contender names (below)")
    ap.add_argument("--layers", type=int, help="layers of every model (default: each model's in ZOO; --tiny: 2)")
    ap.add_argument("--batch", type=int, default=2, help="sequences per step")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per sequence (--tiny: 32)")
    ap.add_argument("--steps", type=int, help="timed steps per contender, in interleaved turns (default: 20; --tiny: 2)")
    ap.add_argument("--tiny", action="store_true", help="the CPU smoke test: tiny configs in fp32")
    ap.add_argument("--buckets", help="comma-separated sequence lengths each contender also steps over in turns")
    ap.add_argument("--add", action="store_true",
                    help="add this run's contenders to the model's JSON already in --out (a deep model whose "
                         "contenders need more than one call); each keeps its x torch.compile against its own "
                         "run's, so give every run torch.compile")
    a = ap.parse_args(argv)
    buckets = tuple(int(n) for n in a.buckets.split(",")) if a.buckets else ()
    a.tiny = a.tiny or not torch.cuda.is_available()
    if a.tiny:
        a.seq = min(a.seq, 32)
    steps = a.steps or (2 if a.tiny else 20)
    names = (a.models or ",".join(TINY_MODELS if a.tiny else ZOO)).split(",")
    contenders = [c for c in a.contenders.split(",") if c]
    os.makedirs(a.out, exist_ok=True)
    results = []
    for name in names:
        layers = a.layers or (2 if a.tiny else ZOO.get(name, (2, 2))[0])
        path = os.path.join(a.out, f"zoo-{name}.json")
        r = run_model(name, contenders, layers, a.batch, a.seq, steps, a.tiny, buckets, partial=path + ".partial")
        r["device"] = _device()
        if a.add and os.path.exists(path):
            with open(path) as f:
                r = added_run(json.load(f), r)
        results.append(r)
        with open(path, "w") as f:
            json.dump(r, f, indent=1)
        if os.path.exists(path + ".partial"):
            os.remove(path + ".partial")
    print(report(results))


if __name__ == "__main__":
    main()
