"""What a training step holds for its backward, per layer, by contender (CPU or GPU): the
bytes of the distinct tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``
sees thunder's ``save_for_backward`` as it sees eager's and AOTAutograd's), for a model of
``benchmarks/model_zoo`` at its real width with ``L`` and ``L + 1`` layers; the difference
is one layer's. Held from the forward to the backward, these bytes are most of a step's
peak beyond its parameters, gradients and optimizer state, so the per-layer figure times
the depth compares contenders' peaks without a GPU.

    python -m benchmarks.saved_bytes Llama-3.2-1B,pythia-1b [--tokens 512] [--contenders eager,thunder+fuser]

``thunder+fuser no-recompute`` is thunder + fuser with ``THUNDER_FUSER_RECOMPUTE=0``
(``passes/recompute_in_backward.py``; ``benchmarks/contenders.py`` sets it). ``--out`` writes the rows as JSON, for the results
page (``benchmarks/results/saved-bytes.json``).
"""

from __future__ import annotations

import json
import os
import platform

import torch

import thunder_fuser  # noqa: F401  (before thunder)
from benchmarks import cli
from benchmarks.contenders import wrap
from benchmarks.model_zoo import batch, build


def saved_bytes(name: str, layers: int, kind: str, tokens: int, device: str, dtype, tiny: bool = False) -> int:
    """Bytes of the distinct storages one step of ``kind`` saves, parameters' left out;
    ``tiny``: the zoo's tiny config of the model (its CPU smoke test's)."""
    built = build(name, layers=layers, tiny=tiny, device=device, dtype=dtype)
    idx, targets = batch(built, 1, tokens, device=device)
    fn = wrap(kind, built.module)  # ``thunder+fuser no-recompute`` sets its setting around each call
    fn(idx, targets)  # a first step: tracing and compilation outside the count
    seen = {p.untyped_storage().data_ptr(): 0 for p in built.module.parameters()}  # (views of) parameters count 0

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(idx, targets)
    loss.backward()
    return sum(seen.values())


def table(doc: dict) -> str:
    """Markdown: each model's contenders, one layer's held MiB and against torch.compile's."""
    lines = [f"| model | contender | held a layer (MiB, {doc['tokens']} tokens) | x torch.compile |",
             "| --- | --- | ---: | ---: |"]
    for r in doc["rows"]:
        ref = next((q["mib"] for q in doc["rows"] if q["model"] == r["model"] and q["contender"] == "torch.compile"), None)
        cell = f"{r['mib'] / ref:.2f}" if ref and r["mib"] is not None else ""
        mib = f"{r['mib']:.2f}" if r["mib"] is not None else r["error"]
        lines.append(f"| {r['model']} | {r['contender']} | {mib} | {cell} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = cli.parser("benchmarks.saved_bytes", __doc__)
    ap.add_argument("models")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=1, help="L: the model is built with L and L + 1 layers")
    ap.add_argument("--contenders", default="eager,torch.compile,thunder+fuser,thunder+fuser no-recompute")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="a JSON file for the rows (added to those it holds, a row per model and contender)")
    a = ap.parse_args(argv)
    rows = []
    for name in a.models.split(","):
        for kind in a.contenders.split(","):
            try:
                small = saved_bytes(name, a.layers, kind, a.tokens, a.device, torch.bfloat16)
                big = saved_bytes(name, a.layers + 1, kind, a.tokens, a.device, torch.bfloat16)
                rows.append(dict(model=name, contender=kind, mib=round((big - small) / 2**20, 2), error=None))
            except Exception as e:  # noqa: BLE001 - a contender that fails is a row, not the end of the run
                rows.append(dict(model=name, contender=kind, mib=None,
                                 error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"))
            print(rows[-1], flush=True)
    device = torch.cuda.get_device_name() if a.device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    doc = dict(device=device, torch=torch.__version__, tokens=a.tokens, dtype="bfloat16", rows=rows)
    if not a.out:
        print(table(doc))
        return 0
    old = json.load(open(a.out)) if os.path.exists(a.out) else dict(rows=[])
    ran = {(q["model"], q["contender"]) for q in rows}
    merged = [r for r in old["rows"] if (r["model"], r["contender"]) not in ran] + rows
    first = {m: i for i, m in reversed(list(enumerate(r["model"] for r in merged)))}
    doc["rows"] = sorted(merged, key=lambda r: first[r["model"]])  # each model's rows together, in first-seen order
    return cli.write_results(a.out, doc, table)


if __name__ == "__main__":
    raise SystemExit(main())
