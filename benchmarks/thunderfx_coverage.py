"""Which zoo models the ThunderFX path trains, from a coverage run of the zoo.

    python -m benchmarks.zoo_parallel --models <all> --per-gpu 5 --layers 2 --steps 3 \\
        --contenders thunderfx+fuser --out /tmp/z
    python -m benchmarks.thunderfx_coverage /tmp/z [--note "..."] [--update]

A coverage run steps every zoo model through ``torch.compile(model,
backend=ThunderCompiler(executors=thunder_fuser.executors(), ...))`` at 2 layers, several
models at once on a GPU, each checked against eager's first step (loss, every gradient,
AdamW's update). This gathers what each model's ``zoo-<model>.json`` says of that contender
into ``benchmarks/results/thunderfx-coverage.json``: did it run, did it match eager (else
the check's words), the kernels and fallbacks of a step. Its step times are shared with the
models beside it on the GPU: they say the step ran, never how fast. ``--update`` keeps the
models of the committed file this run did not step (a second run of a few models).
"""

from __future__ import annotations

import glob
import json
import os

from benchmarks import cli

CONTENDER = "thunderfx+fuser"
OUT = "benchmarks/results/thunderfx-coverage.json"


def row(doc: dict) -> dict:
    """One model's line: what its zoo JSON says of the ThunderFX contender."""
    c = doc["contenders"].get(CONTENDER, {})
    return {"model": doc["name"], "layers": doc["layers"], "full_depth": doc.get("full_depth"),
            "matches_eager": bool(c) and c.get("error") is None, "error": c.get("error") if c else "did not run",
            "step_ms_shared": c.get("step_ms"), "kernels_per_step": c.get("kernels_per_step"),
            "torch_kernel_ms": (c.get("gpu_ms_by_kind") or {}).get("torch"),
            "fallbacks": len(c.get("fallbacks") or ()), "first_call_s": c.get("first_call_s")}


def gather(folder: str, note: str = "", previous: dict | None = None) -> dict:
    """The coverage of every ``zoo-*.json`` in ``folder`` (and, from ``previous``, of the
    models this run did not step)."""
    docs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(folder, "zoo-*.json")))]
    rows = {r["model"]: r for r in (previous or {}).get("models", [])}
    rows.update({d["name"]: row(d) for d in docs})
    device = docs[0]["device"] if docs else (previous or {}).get("device", "")
    return {"device": device, "note": note or (previous or {}).get("note", ""), "models": list(rows.values())}


def table(doc: dict) -> str:
    """The coverage as a markdown table, the models that did not match eager first."""
    lines = ["| model | layers (full) | matches eager | kernels a step | torch kernels ms | fallbacks | "
             "step ms (GPU shared) | first call s | why not |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in sorted(doc["models"], key=lambda r: (r["matches_eager"], r["model"])):
        lines.append(f"| {r['model']} | {r['layers']} ({r['full_depth']}) | {'yes' if r['matches_eager'] else '**no**'} | "
                     f"{r['kernels_per_step'] or ''} | {r['torch_kernel_ms'] or ''} | {r['fallbacks']} | "
                     f"{r['step_ms_shared'] or ''} | {r['first_call_s'] or ''} | {r['error'] or ''} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = cli.parser("benchmarks.thunderfx_coverage", __doc__)
    ap.add_argument("folder", help="the --out folder of a zoo coverage run (its zoo-<model>.json)")
    ap.add_argument("--out", default=OUT, help="the coverage JSON to write")
    ap.add_argument("--note", default="", help="how the run was made (GPU, models at once, versions)")
    ap.add_argument("--update", action="store_true", help="keep the models of --out this run did not step")
    a = ap.parse_args(argv)
    previous = json.load(open(a.out)) if a.update and os.path.exists(a.out) else None
    return cli.write_results(a.out, gather(a.folder, a.note, previous), table)


if __name__ == "__main__":
    raise SystemExit(main())
