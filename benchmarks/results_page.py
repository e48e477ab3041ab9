"""``benchmarks/RESULTS.md``: the latest run of each benchmark, generated from the JSON the
benchmarks write into ``benchmarks/results/``. Nothing older is kept there: earlier runs
are in git history, and what was tried, and why a design stands, in ``docs/history.md``.

    python -m benchmarks.results_page [benchmarks/results] > benchmarks/RESULTS.md
"""

from __future__ import annotations

import functools
import json
import os

from benchmarks.cross_entropy import markdown as loss_table
from benchmarks.models_report import table as models_table
from benchmarks.summary import summary as suite_tables

METHOD = """\
Every contender's output, every in-place update and (for training steps) every gradient is
checked against eager before it is timed; a contender that fails says why in its row.
Bandwidth is read against a device-to-device copy measured in the same run (bytes read plus
written). Memory is shown as the peak of a step and as what a step holds between steps."""


def _load(results: str, name: str):
    path = os.path.join(results, name)
    return json.load(open(path)) if os.path.exists(path) else None


def _load_all(results: str, prefix: str) -> list:
    """Every ``<prefix>*.json`` of the results folder, by name."""
    return [d for d in (_load(results, n) for n in sorted(os.listdir(results))
                        if n.startswith(prefix) and n.endswith(".json")) if d]


def _suite(results: str) -> list[str]:
    doc, warm = _load(results, "latest.json"), _load(results, "warm_cache.json")
    if doc is None:
        return []
    return [
        "## Kernels (`python -m benchmarks.run`)", "",
        f"{doc['device']}; torch {doc['torch']}; {doc['date']}; copy {doc['copy_TBps']:.2f} TB/s in the run.",
        "Times are the median of 50 CUDA-graph replays queued back to back; host overhead the wall",
        "clock of 100 back-to-back calls at small sizes. Every size and contender:",
        "[results.md](results/results.md); large sizes as % of copy: [chart.png](results/chart.png).", "",
        suite_tables(doc, warm or {}),
    ]


def _layers(config: dict) -> int:
    return config.get("n_layer", config.get("num_hidden_layers"))  # litgpt's name, transformers'


def _models(results: str) -> list[str]:
    lines = []
    for name, what in (("models.json", "cut to 2 layers"), ("models-full-depth.json", "at full depth")):
        doc = _load(results, name)
        if doc is None:
            continue
        shape = {m["name"]: f"{_layers(m['config'])} layers, {m['config']['batch']} x {m['config']['seq']} tokens"
                 for m in doc["models"]}
        shapes = (f"{next(iter(shape.values()))} each" if len(set(shape.values())) == 1
                  else "; ".join(f"{k} {v}" for k, v in shape.items()))
        lines += [
            f"## Training steps of real models, {what} (`python -m benchmarks.models`)", "",
            f"{doc['device']}. {shapes}. Forward with the loss and backward, bf16, no optimizer step; each",
            "contender's step the median of its timed steps, taken in turns over all the model's contenders.",
            "thunder + fuser is the README's recommended call; thunderfx + fuser the same through ThunderFX.", "",
            models_table(doc["models"]), "",
        ]
    return lines


def _loss(results: str) -> list[str]:
    doc = _load(results, "cross_entropy.json")
    if doc is None:
        return []
    return ["## The loss over a vocabulary (`python -m benchmarks.cross_entropy`)", "",
            "Forward and backward of `F.cross_entropy` over bf16 logits.", "", loss_table(doc)]


def _decode(results: str) -> list[str]:
    docs = _load_all(results, "decode")
    if not docs:
        return []
    lines = ["## Decode steps (`python -m benchmarks.decode`)", "",
             f"{docs[0]['device']}. One token a step over a KV cache, after a prefill; `graphed` is "
             "`thunder_fuser.graphed(step)`.", "",
             "| model | layers | contender | step ms | x torch.compile reduce-overhead | prefill s | error |",
             "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for d in docs:
        ro = d["contenders"].get("torch.compile reduce-overhead", {}).get("step_ms")
        for kind, r in d["contenders"].items():
            ms = r.get("step_ms")
            ratio = f"{ro / ms:.2f}" if ro and ms else ""
            err = (r.get("error") or "")[:80].replace("|", "/")
            lines.append(f"| {d['model']} | {d['layers']} | {kind} | {ms if ms is not None else ''} | {ratio} | "
                         f"{r.get('prefill_s', '')} | {err} |")
    return lines + [""]


def _tables(results: str, prefix: str, table, heading: str, text: str, intro=lambda d: []) -> list[str]:
    """A section of every ``<prefix>*.json``: its heading and text, then per run the lines
    ``intro`` gives and the run's ``table``."""
    docs = _load_all(results, prefix)
    if not docs:
        return []
    lines = [heading, "", text, ""]
    for d in docs:
        lines += intro(d) + [table(d), ""]
    return lines


def _distributed(results: str) -> list[str]:
    from benchmarks.distributed import table

    def intro(d):
        lines = [f"{d['device']} x {d['world']}: {d['model']} at {d['layers']} layers, {d['rows_per_rank']} x "
                 f"{d['seq']} tokens per rank, optimizer {d.get('optimizer', 'none')}, FSDP bucketing "
                 f"{d.get('bucketing', 'none')}.", ""]
        return lines + ([d["note"] + ".", ""] if d.get("note") else [])

    return _tables(results, "distributed", table, "## Training on several GPUs (`python -m benchmarks.distributed`)",
                   "Each rank steps its own rows, AdamW in every step; losses are the three warm-up steps' on rank 0, "
                   "'= thunder's' compares them with thunder's default executors under the same FSDP. Comm hidden: of "
                   "the NCCL kernels' time, the part under a compute kernel. Of the profiled step's device timeline: compute "
                   "busy, the time some compute kernel runs; NCCL exposed, the NCCL time under no compute kernel. The "
                   "profiler slows the host, so a host-bound step's profiled timeline has more idle time than its "
                   "timed steps.", intro)


def _elsewhere(docs: list) -> str:
    """What the zoo's heading says of contenders a later run added on another GPU."""
    marked = any(c.get("device") for d in docs for c in d["contenders"].values())
    return " (a contender whose label names another GPU ran there, beside its own run's torch.compile)" if marked else ""


def _zoo_devices(docs: list) -> str:
    """The zoo heading's GPU: the one every model's first run had, or each with its models."""
    by_device: dict = {}
    for d in docs:
        by_device.setdefault(d["device"], []).append(d["name"])
    if len(by_device) == 1:
        return docs[0]["device"]
    return "; ".join(f"{device} (first run of {', '.join(names)})" for device, names in by_device.items())


def _zoo(results: str) -> list[str]:
    from benchmarks.zoo import KINDS_BY, bucket_table, geometric_mean_line, group_table, outside_table, table

    docs = _load_all(results, "zoo-")
    if not docs:
        return []
    lines = ["## Whole training steps of the model zoo (`python -m benchmarks.zoo`)", "",
            f"{_zoo_devices(docs)}{_elsewhere(docs)}. Each model at its full depth or at the layers shown (full depth in "
            "brackets), its real width, the forward with the loss, the backward, torch's fused AdamW and "
            "`zero_grad` in every step (thunder+fuser+step: the optimizer's step through us by ThunderFX, "
            "thunder+fuser+jitstep: by `thunder.jit(opt.step)`, torch.compile+step: by `torch.compile(opt.step)`; "
            "a contender of a later run (`--add`) is against that run's torch.compile). Contenders in "
            "interleaved turns, each checked against eager (loss, gradients, first update) before and after "
            "them. GPU ms split by kernel: matmuls, attention, ours, the optimizer's, Triton's, and torch's "
            "others (named in each model's JSON). GPU idle: the step's waits between kernels (the longest, "
            "with the kernels around them, in the JSON); alone ms: the contender's steps alone in the process, "
            "before the turns.", "", table(docs), "", geometric_mean_line(docs), ""]
    older = [d["name"] for d in docs if any(c.get("gpu_ms_by_kind") and c.get("kinds_by") != KINDS_BY
                                            for c in d["contenders"].values())]
    if older:
        lines += [f"In the runs of {', '.join(older)}, the matmul column holds two kernels of ours as well "
                  "(a column reduction's `partial` and `finalize`, told apart by name only since): their "
                  "ours is too low and their matmul too high by the same amount.", ""]
    groups = group_table(docs)
    if groups:
        lines += ["Our fused kernels beside Inductor's, op group by op group (each kernel's group read from the ops "
                  "its name lists: `fuser_<family>_<ops>`, `triton_..._fused_<ops>`): thunder + fuser's GPU ms "
                  "against torch.compile's in the same run.", "", groups, ""]
    outside = outside_table(docs)
    if outside:
        lines += ["Torch kernels thunder + fuser's step ran outside our regions, and why (a copy or an "
                  "elementwise op among them is ours to take).", "", outside, ""]
    buckets = bucket_table(docs)
    if buckets:
        lines += ["Bucketed sequence lengths (`--buckets`): each length's first step, its steps alone (fixed) "
                  "and in turns over the lengths, and what the turns built again.", "", buckets, ""]
    return lines


def _one_table(module: str, name: str, heading: str, text: str, results: str) -> list[str]:
    """A section of one results JSON: ``heading``, ``text`` filled in from it and
    ``module``'s ``table(doc)``; none where the JSON is not there."""
    import importlib

    doc = _load(results, name)
    return [] if doc is None else [heading, "", text.format(**doc), "", importlib.import_module(module).table(doc), ""]


_THUNDERFX = (
    "{device}. Every zoo model at 2 layers through `torch.compile(model, backend=ThunderCompiler("
    "executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms()))`, AdamW in the loop, its first step "
    "checked against eager's (loss, every gradient, the update). Several models shared the GPU, so a step's ms says it "
    "ran, not how fast. {note}.")
_SAVED = (
    "{device}; torch {torch}; {dtype}. The distinct tensors autograd saves in one training step (parameters left out), "
    "for each model at its real width with one layer and with two: the difference is a layer's, at the tokens shown "
    "(it grows with them). Held from the forward to the backward, these are most of a step's peak beyond the "
    "parameters, gradients and optimizer state. thunder+fuser no-recompute: `THUNDER_FUSER_RECOMPUTE=0` "
    "(`passes/recompute_in_backward.py` off); thunder+fuser no-gqa: `THUNDER_FUSER_GQA=0` (grouped-query K and V "
    "expanded to every query head before attention, `passes/grouped_query_attention.py` off). Measured on the CPU, where Inductor's C++ code for some models does not "
    "compile (the rows say so); a GPU's attention saves its own statistics.")
_thunderfx, _saved = (functools.partial(_one_table, *section) for section in (
    ("benchmarks.thunderfx_coverage", "thunderfx-coverage.json",
     "## Which zoo models train through ThunderFX (`python -m benchmarks.thunderfx_coverage`)", _THUNDERFX),
    ("benchmarks.saved_bytes", "saved-bytes.json",
     "## What a training step holds for its backward (`python -m benchmarks.saved_bytes`)", _SAVED)))


def _optimizer(results: str) -> list[str]:
    from benchmarks.optimizer import table

    return _tables(results, "optimizer", table, "## The optimizer step alone (`python -m benchmarks.optimizer`)",
                   "torch's AdamW over a whole model's parameters at full depth (bf16 parameters and moments), as the "
                   "seed measured Adam: eager (foreach), eager fused, `torch.compile(opt.step)`, and "
                   "`torch.compile(opt.step, backend=ThunderCompiler(...))` with thunder's executors and with ours, and "
                   "`thunder.jit(opt.step, executors=thunder_fuser.executors())` (the README's call). "
                   "GPU ms below step ms means the step waits on the host (the 124M model's). Steps queued back "
                   "to back, contenders in turns; every contender's parameters and moments checked "
                   "against eager's after three steps. x copy limit: the step against the bytes it must move "
                   "(7 per parameter element) at the copy bandwidth of the run. Extra: memory a step allocates "
                   "beyond what it holds. Held: what the contender holds between steps by its tensors' sizes "
                   "(parameters, masters and their gradients, the optimizer's state; not the model's gradients; "
                   "filled in from those sizes for runs made before the column). Master fp32 (`--master fp32`, the mixed-precision recipe): the model's "
                   "parameters and gradients bf16, the optimizer's master weights, their gradients and the moments "
                   "fp32; a step copies the bf16 gradients into the masters' (torch's foreach copy), steps the "
                   "masters and copies them back into the bf16 parameters; its copy limit is of 28 bytes a parameter "
                   "(the bf16 gradient read, master and moments read and written, the bf16 parameter written). "
                   "With the model's bf16 gradient it holds 20 bytes a parameter (held: 18) against 8 in bf16 "
                   "(held: 6): 30.0 against 12.0 GB for Llama-3.2-1B's 1.5e9 parameters.")


def page(results: str) -> str:
    lines = ["# Benchmark results", "",
             "Generated by `python -m benchmarks.results_page` from the JSON in [results/](results/): the",
             "latest run of each benchmark. What was tried, and why a design stands:",
             "[docs/history.md](../docs/history.md).", "", "## How these are measured", "", METHOD, ""]
    for part in (_zoo, _saved, _thunderfx, _models, _suite, _optimizer, _loss, _decode, _distributed):
        lines += part(results)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    from benchmarks import cli

    ap = cli.parser("benchmarks.results_page", __doc__)
    ap.add_argument("results", nargs="?", default="benchmarks/results", help="the results folder")
    print(page(ap.parse_args(argv).results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
