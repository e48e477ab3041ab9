"""The loss over a vocabulary, forward + backward, beside every peer (GPU machine).

    python -m benchmarks.cross_entropy [--out benchmarks/results]

Per shape (bf16 logits ``[tokens, vocab]``, int64 targets, a tenth of them ignored) and per
contender: the step ``loss = F.cross_entropy(x.float(), t); loss.backward()`` (as a model's
loss is written, its logits upcast) and, where a contender takes bf16 logits as they are
(quack, Liger-Kernel), ``F.cross_entropy(x, t)``. Each contender's loss and gradient are
checked against eager's in float64 first. Times: the median of 20 back-to-back steps
between CUDA events; bandwidth against the fewest bytes a fused loss must move (read the
logits twice, write the gradient once: ``3 * tokens * vocab * 2`` bytes) and against a
device-to-device copy measured in the same run. Memory: the peak during a step beyond the
logits and their gradient. One more row (``FLOOR``) times a thunder step that only sums the
logits: less GPU work than any loss (one read, and a gradient written), and the host work
every thunder contender pays per step, so no thunder loss step can be faster. Writes
``cross_entropy.json`` and ``cross_entropy.md`` under ``--out``; the table is printed last.
"""

from __future__ import annotations

import json
import os
import statistics
import traceback

import torch
import torch.nn.functional as F

import thunder_fuser  # noqa: F401  (torch compat stubs before thunder)
import thunder
from thunder.executors.torch_compile import torch_compile_ex

from benchmarks import cli
from benchmarks.run import copy_bandwidth
from thunder_fuser import fuser_ex

SHAPES = ((4096, 32000), (8192, 128256), (4096, 50257))
STEPS = 20


def _upcast_loss(x, t):
    return F.cross_entropy(x.float(), t)


def _plain_loss(x, t):
    return F.cross_entropy(x, t)


def _upcast_sum(x, t):
    return x.float().sum()


# not a loss: the step of a thunder-jitted function that only sums its input, a lower bound
# of any thunder loss step: thunder's host work per step (its cache lookup, prologue and
# autograd glue) and one read of the logits and one write of a gradient. Timed, never checked
FLOOR = "thunder floor: x.float().sum(), fuser_ex"


def contenders() -> dict:
    """name -> the loss function it runs (None where its package is missing)."""
    out = {
        "eager": _upcast_loss,
        "torch.compile": torch.compile(_upcast_loss),
        "thunder+torchcompile": thunder.jit(_upcast_loss, executors=[torch_compile_ex]),
        "thunder+fuser": thunder.jit(_upcast_loss, executors=[fuser_ex]),
        "thunder+fuser, bf16 logits": thunder.jit(_plain_loss, executors=[fuser_ex]),
        FLOOR: thunder.jit(_upcast_sum, executors=[fuser_ex]),
    }
    try:
        from quack.cross_entropy import cross_entropy as quack_ce

        out["quack"] = lambda x, t: quack_ce(x, t, reduction="mean")
    except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
        out["quack"] = f"not installed: {type(e).__name__}: {e}"[:200]
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy

        out["Liger-Kernel"] = lambda x, t: liger_cross_entropy(x, t)
    except Exception as e:  # noqa: BLE001
        out["Liger-Kernel"] = f"not installed: {type(e).__name__}: {e}"[:200]
    return out


def _problem(n: int, v: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, v, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[::10] = -100
    return x, t


def _step(fn, x, t):
    x.grad = None
    loss = fn(x, t)
    loss.backward()
    return loss


def _check(fn, x, t) -> str | None:
    """None where loss and gradient match eager's float64 result, else why not."""
    xs = x.detach().clone().requires_grad_()
    loss = _step(fn, xs, t)
    ref = x.detach().double().requires_grad_()
    want = F.cross_entropy(ref, t)
    want.backward()
    err = abs(loss.double().item() - want.item()) / max(1e-6, abs(want.item()))
    gerr = ((xs.grad.double() - ref.grad).norm() / ref.grad.norm()).item()
    if not (err < 1e-2 and gerr < 2e-2):
        return f"wrong: loss rel err {err:.2e}, grad rel err {gerr:.2e}"
    return None


def _time(fn, x, t) -> tuple[float, float]:
    """(median ms per step, the peak GiB of one step beyond the logits and their gradient)."""
    xs = x.detach().clone().requires_grad_()
    for _ in range(3):
        _step(fn, xs, t)
    times = []
    for _ in range(STEPS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        _step(fn, xs, t)
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    xs.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _step(fn, xs, t)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - xs.grad.numel() * xs.grad.element_size()
    return statistics.median(a.elapsed_time(b) for a, b in times), extra / 2**30


def main(argv=None) -> int:
    ap = cli.parser("benchmarks.cross_entropy", __doc__)
    ap.add_argument("--out", default="benchmarks/results", help="folder for the results")
    ap.add_argument("--profile", action="store_true", help="print each contender's kernels per step instead")
    args = ap.parse_args(argv)
    cli.require_cuda("benchmarks.cross_entropy")
    if args.profile:
        return profile()
    copy = copy_bandwidth()  # the suite's reference copy, measured in this run
    rows = []
    fns = contenders()
    for n, v in SHAPES:
        x, t = _problem(n, v)
        floor_bytes = 3 * n * v * 2
        for name, fn in fns.items():
            row = {"shape": [n, v], "contender": name}
            if isinstance(fn, str):
                row["error"] = fn
            else:
                try:
                    row["error"] = None if name == FLOOR else _check(fn, x, t)
                    if row["error"] is None:
                        ms, extra = _time(fn, x, t)
                        row.update(ms=ms, extra_GiB=extra, tbps=floor_bytes / (ms * 1e-3) / 1e12)
                except Exception as e:  # noqa: BLE001 - reported per contender
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    traceback.print_exc()
            rows.append(row)
            print(json.dumps(row), flush=True)
        del x, t
        torch.cuda.empty_cache()
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_tbps": copy, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cross_entropy.json"), "w") as f:
        json.dump(doc, f, indent=1)
    md = markdown(doc)
    with open(os.path.join(args.out, "cross_entropy.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def profile() -> int:
    """Each contender's GPU kernels in one step (torch.profiler): name, calls, total us."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for n, v in SHAPES:
        x, t = _problem(n, v)
        for name, fn in contenders().items():
            if isinstance(fn, str) or name in ("eager", "thunder+torchcompile") or (
                    os.environ.get("PROFILE_ONLY") and name not in os.environ["PROFILE_ONLY"].split(";")):
                continue
            xs = x.detach().clone().requires_grad_()
            for _ in range(3):
                _step(fn, xs, t)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                _step(fn, xs, t)
                torch.cuda.synchronize()
            events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            total = sum(e.device_time for e in events)
            print(f"== [{n}, {v}] {name}: {len(events)} kernels, {total:.0f} us")
            by = {}
            for e in events:
                c, us = by.get(e.name, (0, 0.0))
                by[e.name] = (c + 1, us + e.device_time)
            for k, (c, us) in sorted(by.items(), key=lambda kv: -kv[1][1])[:8]:
                print(f"   {us:9.0f} us  {c:3d}x  {k[:110]}")
        del x, t
        torch.cuda.empty_cache()
    return 0


def _one_line(text) -> str:
    """An error as one table cell: no colour codes, no line breaks, no pipes."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(text))
    return " ".join(text.replace("|", "/").split())[:160]


def markdown(doc) -> str:
    lines = [f"{doc['device']}; torch {doc['torch']}; copy {doc['copy_tbps']:.2f} TB/s", "",
             "| shape | contender | ms | x torch.compile | x quack | TB/s of 3 passes | % of copy | extra GiB |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for shape in dict.fromkeys(tuple(r["shape"]) for r in doc["rows"]):
        rows = [r for r in doc["rows"] if tuple(r["shape"]) == shape]
        ref = {r["contender"]: r.get("ms") for r in rows}
        for r in rows:
            if r.get("ms") is None:
                lines.append(f"| {list(shape)} | {r['contender']} | failed: {_one_line(r.get('error'))} | | | | | |")
                continue
            if r["contender"] == FLOOR:
                lines.append(f"| {list(shape)} | {r['contender']} | {r['ms']:.3f} | | | | | |")
                continue
            tc, qk = ref.get("torch.compile"), ref.get("quack")
            lines.append(
                f"| {list(shape)} | {r['contender']} | {r['ms']:.3f} | {tc / r['ms'] if tc else float('nan'):.2f} | "
                f"{qk / r['ms'] if qk else float('nan'):.2f} | {r['tbps']:.2f} | {100 * r['tbps'] / doc['copy_tbps']:.0f} | "
                f"{r['extra_GiB']:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
