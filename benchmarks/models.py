"""Whole training steps of real models beside every peer (GPU machine): the unit of success.

    python -m benchmarks.models --out DIR [--models A,B] [--contenders X,Y] [--layers 2]
    python -m benchmarks.models --merge DIR [DIR ...] --results benchmarks/results

Per model (``benchmarks/model_zoo.py``) and contender, in one process: build the model in
bf16, take one step (forward with the loss, backward) and check the loss and every gradient
against eager's; read the memory held between steps (allocated after a step, with its
gradients: parameters and gradients are what every contender keeps; other contenders'
memory, kept for the timing, subtracted; ``held_with_pools_GiB``, the CUDA graph pools it
made counted whole) and its peak, one step under torch.profiler (GPU
kernels per step, copies among them, the heaviest kernels), and for thunder + fuser the
segments on the reference backend and every warning a step raised. ``first_call_s`` is the
first step's wall time, tracing and compiling included, with a cold kernel cache (fuser:
a fresh ``THUNDER_FUSER_CACHE``); a second process then takes the first step again on the
disk caches (``first_call_warm_s``; for torch.compile and thunder too,
``second_processes``). ``second_call_s`` is the next step's: thunder + fuser's first step
runs on the reference backend while worker processes compile its kernels
(``backends/cute/compile_workers.py``), and the second waits for those still compiling.

Step time is timed last, with every contender of the model alive: ``ROUNDS`` turns over
the contenders, each turn ``TURN_WARMUP`` untimed steps then ``--steps / ROUNDS`` steps
between CUDA events, and the median of a contender's steps; then each contender's step is
checked against eager's once more (``check_after_turns``). A lent host's speed drifts by
tens of percent within a minute (one H100 host, pythia's step, consecutive 30-step medians:
thunder + fuser 4.73 then 3.57 ms, torch.compile 3.13 then 3.71), and a host-bound step
follows it; timed one contender after the other, a ratio was the drift's. Interleaved, each
contender meets the same host.

Several models run one after the other, each in a process of its own (``--one-process``: all
in this one), so that what a process allocates once counts in every model's memory and
every model's first calls meet cold caches. Each run writes ``models-<model>.json`` under
``--out``; ``--merge`` joins them into
``models.json`` (``{"device", "models": [{"name", "config", "contenders": {NAME: {"step_ms",
"tokens_per_s", "peak_GiB", "held_GiB", "first_call_s", "kernels_per_step", "fallbacks",
"error"}}}]}``), ``models.md`` and ``models.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import torch

import thunder_fuser  # noqa: F401  (torch compat stubs before thunder)
import thunder

from benchmarks.contenders import run_label, thunder_functions, wrap
from benchmarks import cli
from benchmarks.model_zoo import MORE, MODELS, TINY_MAX_SEQ, batch, build, fitted
from thunder_fuser.cudagraphs import region_graphs

TINY_MODELS = ("Llama-3.2-1B",)  # --tiny's default: a smoke test of the harness in minutes
CONTENDERS = ("eager", "torch.compile", "thunder", "thunder+torchcompile", "thunder+fuser", "thunderfx+fuser")
GiB = 2**30
ROUNDS = 10  # the timed steps, in turns over the contenders (``time_interleaved``)
# steps after the first, at most, before memory is read: two, and then until a step is
# steady (``settle``: thunder + fuser's first graph with a matmul allocates its capture
# stream's cuBLAS workspace, which a training loop then holds)
SETTLE_MAX = 12


def _step(fn, idx, targets):
    loss = fn(idx, targets)
    loss.backward()
    return loss.detach()


def _zero(module):
    for p in module.parameters():
        p.grad = None


def _check(module, loss, ref_loss, ref_grads, tol=3e-2) -> str | None:
    """None when the loss and every gradient are within bf16 tolerance of eager's. A
    gradient that is zero but for roundings (a key's bias: softmax ignores a shift of every
    score of a row) is measured against the largest gradient's norm. Each gradient is
    compared where it lives, eager's moved there one at a time (a host pass over a 1.5B
    model's gradients took tens of seconds per contender)."""
    loss = loss.cpu()
    if not torch.isfinite(loss).all() or abs(loss.item() - ref_loss.item()) > tol * max(1.0, abs(ref_loss.item())):
        return f"loss {loss.item():.5f} against eager's {ref_loss.item():.5f}"
    norms = []  # (name, the difference's norm, eager's norm)
    for (name, p), g in zip(module.named_parameters(), ref_grads):
        if p.grad is None:
            return f"no gradient for {name}"
        got, want = p.grad.float(), g.to(p.grad.device).float()
        norms.append((name, (got - want).norm().item(), want.norm().item()))
    floor = tol * max((n for _, _, n in norms), default=0.0)
    for name, diff, ref in norms:
        err = diff / (ref + floor + 1e-12)
        if not err < tol:
            return f"gradient of {name} off by {err:.2e}"
    return None


def _fallbacks(fn) -> list[str]:
    from thunder_fuser.runtime.region_runner import RegionRunner

    out = []
    for jfn in thunder_functions(fn):
        for traces in (thunder.last_traces(jfn), thunder.last_backward_traces(jfn)):
            if not traces:
                continue
            for v in traces[-1].python_ctx().values():
                if isinstance(v, RegionRunner):
                    for p in v.plans.values():
                        out += [f"{v.region.name} segment {i}: {r}" for i, r in p.decision.fallbacks.items()]
    return out


def _profile(fn, module, idx, targets) -> dict:
    """GPU kernels of one step: their number, the copies among them, the heaviest."""
    from torch.profiler import ProfilerActivity, profile

    _zero(module)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(fn, idx, targets)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list] = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.device_time)
    top = sorted(((sum(t), len(t), n) for n, t in by_name.items()), reverse=True)
    copies = [e for e in kernels if "copy" in e.name.lower() or "Memcpy" in e.name]
    return {
        "kernels_per_step": len(kernels),
        "gpu_ms": round(sum(e.device_time for e in kernels) / 1000, 3),  # the kernels' own time, no gaps
        "copies_per_step": len(copies),
        "copy_ms": round(sum(e.device_time for e in copies) / 1000, 3),
        "top_kernels": [{"name": n[:160], "calls": c, "ms": round(t / 1000, 3)} for t, c, n in top[:25]],
    }


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device_and_dtype(tiny: bool):
    """bf16 on the GPU; on a machine without one (CI's smoke test of this harness), the
    tiny models in fp32 on the CPU."""
    return ("cuda", torch.bfloat16) if torch.cuda.is_available() else ("cpu", torch.float32)


def _fresh_step(fn, module, idx, targets):
    """A step's loss from gradients zeroed before it."""
    _zero(module)
    loss = _step(fn, idx, targets)
    _sync()
    return loss


def check_after_turns(checks: list) -> None:
    """Each contender's step against eager's again, after its timed turns: those turns
    move the caching allocator's blocks, so CUDA graphs keyed on pointers are captured anew
    and replaced (``cudagraphs/region_graphs.py``), which the first check, a few steps in,
    never saw. A wrong result here is the contender's error."""
    for res, check in checks:
        if res["error"] is None:
            try:
                bad = check()
            except Exception as e:  # noqa: BLE001 - reported as the contender's error
                bad = f"{type(e).__name__}: {str(e)[:400]}"
            if bad:
                res["error"] = f"wrong result after the timed turns: {bad}"


def _time_steps(fn, module, idx, targets, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        _zero(module)
        if torch.cuda.is_available():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            _step(fn, idx, targets)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            _step(fn, idx, targets)
            times.append((time.perf_counter() - t0) * 1000)
    return times


def graph_pools(snapshot: list) -> dict:
    """The private pools of CUDA graphs in ``torch.cuda.memory_snapshot()``: pool id ->
    (bytes of its segments, bytes allocated in them)."""
    pools: dict = {}
    for seg in snapshot:
        pool = tuple(seg.get("segment_pool_id") or (0, 0))
        if pool != (0, 0):
            reserved, allocated = pools.get(pool, (0, 0))
            pools[pool] = (reserved + seg["total_size"], allocated + seg["allocated_size"])
    return pools


def with_pools(held: int, before: dict, now: dict) -> int:
    """``held`` with the graph pools made since ``before`` read whole: a pool's memory is a
    graph's for as long as the graph lives, and ``memory_allocated`` misses what a replay
    writes there without allocating (torch.compile reduce-overhead's outputs and gradients;
    its held figure fell below the parameters it keeps)."""
    new = [v for pool, v in now.items() if pool not in before]
    return held - sum(a for _, a in new) + sum(r for r, _ in new)


def settle(step):
    """Untimed steps after the first, until memory is read: two, then more until a step is
    steady, capturing no CUDA graph and sighting no key that waits for its capture
    (``SETTLE_MAX`` in all at most). A key is captured at its second sighting, so the
    steps before the first capture capture nothing either: read there (H100, pythia: the
    captures begin in the fourth step), memory missed the capture stream's cuBLAS workspace.
    Returns the last step's loss and the first one's seconds (``second_call_s``: thunder +
    fuser's waits for the kernels its worker processes compiled during the first)."""
    for i in range(SETTLE_MAX):
        before = (region_graphs.stats["captures"], region_graphs.stats["sighted"])
        t0 = time.perf_counter()
        loss = step()
        _sync()
        if i == 0:
            second = time.perf_counter() - t0
        if i >= 1 and (region_graphs.stats["captures"], region_graphs.stats["sighted"]) == before:
            break
    return loss, second


def contender_model(name: str, layers: int, ref: dict, tiny: bool):
    """A contender's own copy of model ``name`` with the reference weights, and what the
    process held before it (bytes allocated, CUDA graph pools), which its memory excludes."""
    device, dtype = _device_and_dtype(tiny)
    pools_before: dict = {}
    others = 0
    if torch.cuda.is_available():  # contenders kept for timing (their garbage collected first)
        gc.collect()
        others = torch.cuda.memory_allocated()
        pools_before = graph_pools(torch.cuda.memory_snapshot())
    built = build(name, layers, tiny=tiny, device=device, dtype=dtype, longest=ref.get("longest"))
    built.module.load_state_dict(ref["state"])
    return built, others, pools_before


def our_warnings(caught: list) -> list[str]:
    """The warnings a contender's steps raised that are ours (a kernel's fallback and the like)."""
    return sorted({f"{w.category.__name__}: {str(w.message)[:240]}" for w in caught
                   if "fuser" in w.category.__module__ or "Kernel" in w.category.__name__})


def run_contender(kind: str, name: str, layers: int, batch_size: int, seq: int, ref, tiny=False, timers=None,
                  checks=None) -> dict:
    """One contender's checks, first calls, memory and profile. Its step, for the timing
    that follows (``time_interleaved``), goes to ``timers`` (label-less: the caller names
    it), the contender kept alive until then; to ``checks``, its step checked against
    eager's once more after the timing (``check_after_turns``)."""
    built, others, pools_before = contender_model(name, layers, ref, tiny)
    module = built.module
    idx, targets = ref["batch"]
    res: dict = {"error": None}
    caught: list = []
    try:
        _sync()
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn = wrap(kind, module)
            loss = _step(fn, idx, targets)
            _sync()
        res["first_call_s"] = round(time.perf_counter() - t0, 2)
        bad = _check(module, loss, ref["loss"], ref["grads"])
        if bad:
            res["error"] = f"wrong result: {bad}"
            return res
        loss, second = settle(lambda: (_zero(module), _step(fn, idx, targets))[1])
        res["second_call_s"] = round(second, 2)
        bad = _check(module, loss, ref["loss"], ref["grads"])  # the kernels' (the first step's may not be)
        if bad:
            res["error"] = f"wrong result after the first step: {bad}"
            return res
        if torch.cuda.is_available():
            gc.collect()
            torch.cuda.synchronize()
            # after a step, with its gradients
            held = torch.cuda.memory_allocated() - others
            res["held_GiB"] = round(held / GiB, 3)
            res["held_with_pools_GiB"] = round(
                with_pools(held, pools_before, graph_pools(torch.cuda.memory_snapshot())) / GiB, 3)
            _zero(module)
            gc.collect()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            _step(fn, idx, targets)
            torch.cuda.synchronize()
            res["peak_GiB"] = round((torch.cuda.max_memory_allocated() - others) / GiB, 3)
            res["peak_over_start_GiB"] = round((torch.cuda.max_memory_allocated() - base) / GiB, 3)
            res.update(_profile(fn, module, idx, targets))
        if kind.startswith("thunder+fuser") or kind == "thunderfx+fuser":
            res["fallbacks"] = _fallbacks(fn)
        res["warnings"] = our_warnings(caught)
        if timers is not None:
            timers.append((res, lambda n: _time_steps(fn, module, idx, targets, n)))
        if checks is not None:
            checks.append((res, lambda: _check(module, _fresh_step(fn, module, idx, targets), ref["loss"], ref["grads"])))
    except Exception as e:  # noqa: BLE001 - a failing contender is reported, never dropped
        res["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        traceback.print_exc()
    finally:
        del built
        if timers is None or res["error"] is not None:
            del module
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return res


# untimed steps that begin each contender's turn: the contender before it left the caching
# allocator's free blocks elsewhere, and a training loop of one model settles in a step or
# two (thunder + fuser's regions capture a CUDA graph at their key's second sighting,
# ``cudagraphs/region_graphs.py``); the same for every contender
TURN_WARMUP = 2
# contenders whose first step is taken again in a second process (``second_processes``)
SECOND_PROCESS = ("torch.compile", "thunder", "thunder+fuser")


def time_interleaved(timers: list, steps: int, batch_size: int, seq: int, rounds: int = ROUNDS) -> None:
    """Each contender's ``step_ms``: the median of its ``steps`` steps, taken in ``rounds``
    turns over all of them (``timers``: ``(result, time_steps)`` pairs), each turn after
    ``TURN_WARMUP`` untimed steps; and ``region_graphs``, the CUDA graph captures and
    replays in its own turns (the counts are the process's: one contender's are not
    another's)."""
    times: list[list[float]] = [[] for _ in timers]
    graphs = [dict.fromkeys(region_graphs.stats, 0) for _ in timers]  # each contender's own turns'
    per_turn = max(1, -(-steps // rounds))
    for _ in range(rounds):
        for (res, time_steps), ts, g in zip(timers, times, graphs):
            before = dict(region_graphs.stats)
            try:
                ts.extend(time_steps(TURN_WARMUP + per_turn)[TURN_WARMUP:])
            except Exception as e:  # noqa: BLE001 - reported, the others timed on
                res["error"] = res["error"] or f"{type(e).__name__}: {str(e)[:400]}"
            for k in g:
                g[k] += region_graphs.stats[k] - before[k]
    for (res, _), g in zip(timers, graphs):
        if any(g.values()):  # CUDA graphs of regions or launch runs it captured and replayed
            res["region_graphs"] = g
    for (res, _), ts in zip(timers, times):
        if res["error"] is None and ts:
            res["step_ms"] = round(statistics.median(ts), 3)
            res["step_ms_each"] = [round(t, 2) for t in ts]
            res["tokens_per_s"] = round(batch_size * seq / res["step_ms"] * 1000)


def run_config(built, batch_size: int, seq: int) -> dict:
    """What the results record of a model's run: its config, the batch, its parameters (M)."""
    params = sum(p.numel() for p in built.module.parameters())
    batch_size, seq = fitted(built, batch_size, seq)
    return dict(built.config, batch=batch_size, seq=seq, params_M=round(params / 1e6, 1))


def release() -> None:
    """Free what the models dropped held: their garbage, then the CUDA cache."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_model(name: str, contenders, layers: int, batch_size: int, seq: int, steps: int, tiny=False) -> dict:
    device, dtype = _device_and_dtype(tiny)
    built = build(name, layers, tiny=tiny, device=device, dtype=dtype)
    idx, targets = batch(built, batch_size, seq, device=device)
    loss = _step(built.module, idx, targets)
    # kept on the host, so that no contender's memory counts them
    ref = {"state": {k: v.detach().to("cpu", copy=True) for k, v in built.module.state_dict().items()},
           "batch": (idx, targets), "loss": loss.cpu(),
           "grads": [p.grad.detach().to("cpu", copy=True) for p in built.module.parameters()]}
    config = run_config(built, batch_size, seq)
    del built
    release()
    out = {"name": name, "config": config, "contenders": {}}
    timers: list = []
    checks: list = []
    for kind in contenders:
        label = run_label(kind, out["contenders"])
        print(f"[{name}] {label} ...", flush=True)
        out["contenders"][label] = run_contender(kind, name, layers, batch_size, seq, ref, tiny, timers, checks)
    try:
        time_interleaved(timers, steps, batch_size, seq)
        check_after_turns(checks)
    finally:
        timers.clear()  # the contenders' models and steps
        checks.clear()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        torch._dynamo.reset()
    for label, r in out["contenders"].items():
        print(f"[{name}] {label}: " + json.dumps({k: v for k, v in r.items() if k != "top_kernels"}), flush=True)
    return out


def warm_first_call(name: str, layers: int, batch_size: int, seq: int, tiny=False, jit=None) -> float:
    """The first step in this process, with the disk caches the run's first calls filled,
    of the module as ``jit`` compiles it (default: thunder + fuser; ``second_processes``
    passes each contender's ``wrap``, ``scripts/first_call_floor.py`` thunder's torch
    executor alone)."""
    device, dtype = _device_and_dtype(tiny)
    built = build(name, layers, tiny=tiny, device=device, dtype=dtype)
    idx, targets = batch(built, batch_size, seq, device=device)
    _sync()
    t0 = time.perf_counter()
    _step((jit or (lambda m: wrap("thunder+fuser", m)))(built.module), idx, targets)
    _sync()
    return round(time.perf_counter() - t0, 2)


def second_processes(name: str, res: dict, a, cache: str) -> None:
    """``first_call_warm_s`` of each contender in ``SECOND_PROCESS`` that ran: its first step
    in a process of its own, after the run's first calls filled the disk caches (thunder +
    fuser's kernels, torch.compile's Inductor and Triton caches; thunder keeps none). Each
    pays what a fresh process pays in its first step (cuBLAS, cuDNN, lazily loaded
    modules), so the three compare: thunder's is the floor of any thunder executor."""
    for kind in SECOND_PROCESS:
        r = res["contenders"].get(kind)
        if r is None or r.get("error") is not None:
            continue
        p = subprocess.run([sys.executable, "-m", "benchmarks.models", "--warm-first-call", name, "--warm-contender",
                            kind, "--layers", str(a.layers), "--batch", str(a.batch), "--seq", str(a.seq)]
                           + (["--tiny"] if a.tiny else []),
                           capture_output=True, text=True, env=dict(os.environ, THUNDER_FUSER_CACHE=cache))
        line = [x for x in p.stdout.splitlines() if x.startswith("WARM ")]
        r["first_call_warm_s"] = float(line[-1].split()[1]) if line else None
        if not line:
            r["first_call_warm_error"] = p.stderr[-400:]


def _device() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (tiny models: a smoke test)"
    return f"{name}; torch {torch.__version__}; lightning-thunder {thunder.__version__}"


def main(argv=None) -> None:
    ap = cli.parser("benchmarks.models", __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1], epilog=(
        f"models: {', '.join(MODELS)} (also stepped by the tests: {', '.join(MORE)})\n"
        f"contenders: {', '.join(CONTENDERS)}\n"
        "On a machine without a CUDA GPU every run is --tiny: the models at a few thousand parameters in fp32."))
    ap.add_argument("--out", default="benchmarks/results", help="folder for models-<model>.json")
    ap.add_argument("--models", help=f"comma-separated model names (below; default: all, with --tiny {','.join(TINY_MODELS)})")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated contender names (below)")
    ap.add_argument("--layers", type=int, default=2, help="transformer layers per model")
    ap.add_argument("--batch", type=int, default=2, help="sequences per step")
    ap.add_argument("--seq", type=int, default=1024, help=f"tokens per sequence (--tiny: at most {TINY_MAX_SEQ})")
    ap.add_argument("--steps", type=int, default=argparse.SUPPRESS,
                    help="timed steps per contender, in turns (ROUNDS) (default: 30; 3 with --tiny)")
    ap.add_argument("--warm-first-calls", choices=("auto", "yes", "no"), default="auto",
                    help="time each compiler's first call again in a second process, its caches warm (auto: yes on "
                         "a GPU, no with --tiny, where its minutes say nothing)")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny configs in fp32, one model unless --models says, 3 timed steps unless --steps says: "
                         "the CPU smoke test of the harness (its timings mean nothing)")
    ap.add_argument("--one-process", action="store_true",
                    help="all models in this process (else a process of its own for each of several models)")
    ap.add_argument("--warm-first-call", metavar="MODEL", help="(internal) print the first call of MODEL in this process")
    ap.add_argument("--warm-contender", default="thunder+fuser", help="(internal) the contender --warm-first-call takes")
    ap.add_argument("--merge", nargs="*", metavar="DIR", help="join the runs' JSON files into --results")
    ap.add_argument("--results", default="benchmarks/results", help="folder --merge writes models.json, .md, .png to")
    a = ap.parse_args(argv)
    a.tiny = a.tiny or not torch.cuda.is_available()
    if a.tiny:
        a.seq = min(a.seq, TINY_MAX_SEQ)
    a.steps = getattr(a, "steps", 3 if a.tiny else 30)
    a.models = a.models or ",".join(TINY_MODELS if a.tiny else MODELS)
    if a.merge is not None:
        from benchmarks.models_report import merge

        merge(a.merge, a.results)
        return
    if a.warm_first_call:
        print("WARM", warm_first_call(a.warm_first_call, a.layers, a.batch, a.seq, a.tiny,
                                     jit=lambda m: wrap(a.warm_contender, m)))
        return
    os.makedirs(a.out, exist_ok=True)
    names = [m for m in a.models.split(",") if m]
    if len(names) > 1 and not a.one_process:
        _process_per_model(a, names)
        return
    cache = tempfile.mkdtemp(prefix="fuser_cache_")
    os.environ["THUNDER_FUSER_CACHE"] = cache  # a cold kernel cache for this process's first calls
    # and cold caches for torch.compile's too (Inductor's and Triton's), so that first calls compare
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_")
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_")
    contenders = [c for c in a.contenders.split(",") if c]
    for name in names:
        r = run_model(name, contenders, a.layers, a.batch, a.seq, a.steps, a.tiny)
        if a.warm_first_calls == "yes" or (a.warm_first_calls == "auto" and not a.tiny):
            second_processes(name, r, a, cache)
        r["device"] = _device()
        with open(os.path.join(a.out, f"models-{name}.json"), "w") as f:
            json.dump(r, f, indent=1)
    _print_table(a.out, names)


def _process_per_model(a, names: list) -> None:
    """Each model in a process of its own, one after the other: what a process allocates
    once (a capture stream's cuBLAS workspace, ``cudagraphs/region_graphs.py``) then counts in
    every model's memory, each model's first calls meet cold caches, and a model whose
    process dies leaves the others' results."""
    for name in names:
        argv = ["--out", a.out, "--models", name, "--contenders", a.contenders, "--layers", str(a.layers),
                "--batch", str(a.batch), "--seq", str(a.seq), "--steps", str(a.steps),
                "--warm-first-calls", a.warm_first_calls] + (["--tiny"] if a.tiny else [])
        rc = subprocess.run([sys.executable, "-m", "benchmarks.models", *argv]).returncode
        if rc:
            print(f"[{name}] its process exited with {rc}", flush=True)
    _print_table(a.out, names)


def _print_table(out: str, names: list) -> None:
    from benchmarks.models_report import table

    paths = [os.path.join(out, f"models-{n}.json") for n in names]
    print(table([json.load(open(p)) for p in paths if os.path.exists(p)]))


if __name__ == "__main__":
    main()
