"""The model benchmark's results as other tools and readers take them: ``models.json`` (the
schema in ``benchmarks/models.py``), ``models.md`` and ``models.png`` (step time against
torch.compile's, per model)."""

from __future__ import annotations

import glob
import json
import os

from benchmarks.models import CONTENDERS


def merge(dirs: list[str], results: str) -> None:
    """Join the runs under ``dirs`` into ``results``. A later run of a model replaces an
    earlier one; a contender it did not run is kept from ``results``' models.json, marked
    ``earlier_run`` (its ratio to torch.compile then compares two runs)."""
    earlier, device = {}, ""
    old = os.path.join(results, "models.json")
    if os.path.exists(old):
        kept = json.load(open(old))
        earlier, device = {m["name"]: m for m in kept["models"]}, kept.get("device", "")
    runs = dict(earlier)
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "models-*.json"))):
            r = json.load(open(path))
            before = runs.get(r["name"], {}).get("contenders", {})
            for kind, c in before.items():
                if kind not in r["contenders"]:
                    r["contenders"][kind] = {**c, "earlier_run": True}
            runs[r["name"]] = r
    models = [runs[n] for n in sorted(runs)]
    for m in models:  # a run's own device (the newest), else the one the results held
        device = m.pop("device", None) or device
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "models.json"), "w") as f:
        json.dump({"device": device, "models": models}, f, indent=1)
    with open(os.path.join(results, "models.md"), "w") as f:
        f.write(f"# Training steps of real models\n\n{device}\n\n{table(models)}\n")
    _chart(models, os.path.join(results, "models.png"))


def _cell(r: dict, key: str, fmt: str = "{}") -> str:
    v = r.get(key)
    return "" if v is None else fmt.format(v)


def _pools_cell(r: dict) -> str:
    """`` (X)``: the held memory with the contender's CUDA graph pools read whole, where that
    differs (torch.compile reduce-overhead's replays write into a pool without allocating)."""
    held, whole = r.get("held_GiB"), r.get("held_with_pools_GiB")
    return f" ({whole})" if held is not None and whole is not None and abs(whole - held) >= 0.005 else ""


def table(models: list[dict]) -> str:
    rows = ["| model | contender | step ms | x torch.compile | GPU ms | tokens/s | held GiB (graph pools whole) | peak GiB | first call s "
            "(second process) | second call s | kernels/step | copies | fallbacks | error |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for m in models:
        tc = m["contenders"].get("torch.compile", {}).get("step_ms")
        # the usual order, then any other run (a contender named again: ``NAME #2``)
        for kind in [k for k in CONTENDERS if k in m["contenders"]] + [k for k in m["contenders"] if k not in CONTENDERS]:
            r = m["contenders"][kind]
            ratio = f"{tc / r['step_ms']:.2f}" if tc and r.get("step_ms") else ""
            first = _cell(r, "first_call_s") + (f" ({r['first_call_warm_s']})" if r.get("first_call_warm_s") else "")
            fb = len(r["fallbacks"]) if "fallbacks" in r else ""
            err = (r.get("error") or "")[:80].replace("|", "/")
            shown = f"{kind} (earlier run)" if r.get("earlier_run") else kind
            rows.append(f"| {m['name']} | {shown} | {_cell(r, 'step_ms')} | {ratio} | {_cell(r, 'gpu_ms')} | "
                        f"{_cell(r, 'tokens_per_s')} | "
                        f"{_cell(r, 'held_GiB')}{_pools_cell(r)} | {_cell(r, 'peak_GiB')} | {first} | {_cell(r, 'second_call_s')} | "
                        f"{_cell(r, 'kernels_per_step')} | "
                        f"{_cell(r, 'copies_per_step')} | {fb} | {err} |")
    return "\n".join(rows)


def _chart(models: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    kinds = [k for k in CONTENDERS if k != "torch.compile"]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / len(kinds)
    for j, kind in enumerate(kinds):
        xs, ys = [], []
        for i, m in enumerate(models):
            tc = m["contenders"].get("torch.compile", {}).get("step_ms")
            ms = m["contenders"].get(kind, {}).get("step_ms")
            if tc and ms:
                xs.append(i + j * width)
                ys.append(tc / ms)
        ax.bar(xs, ys, width, label=kind)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))], [m["name"] for m in models])
    ax.set_ylabel("speed vs torch.compile")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
