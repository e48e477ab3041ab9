"""Turn a run's ``latest.json`` into a markdown table, a CSV and a bar chart."""

from __future__ import annotations

import csv
import json
import math
import os
import sys

CONTENDERS = ("eager", "torch.compile", "thunder", "thunder+torchcompile", "thunder+fuser")
# a large workload is also read beside a copy of its own bytes below this many bytes moved:
# a 35 us workload pays a launch ramp and a tail that the reference copy's 256 MiB-1 GiB
# buffers amortize; larger copies ran at 2.36-3.01 TB/s from one allocation to the next
# (benchmarks/RESULTS.md), where the reference copy is the steadier yardstick
SAME_SIZE_COPY_BELOW = 2**28


def _fmt(x, spec):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def rows(doc):
    copy = doc["copy_TBps"]
    for w in doc["workloads"]:
        tc = w["results"].get("torch.compile", {}).get("ms")
        for c in CONTENDERS:
            r = w["results"].get(c, {})
            ms = r.get("ms")
            speed = tc / ms if ms and tc else None
            yield {
                "workload": w["name"], "size": w["size"], "bytes": w["bytes"], "contender": c,
                "ms": ms, "TBps": r.get("TBps"), "pct_copy": r["TBps"] / copy * 100 if r.get("TBps") else None,
                "vs_torch_compile": speed, "host_us": r.get("host_us"), "compile_s": r.get("compile_s"),
                "error": r.get("error", ""), "fallbacks": len(r.get("fallbacks") or ()),
            }


def markdown(doc) -> str:
    lines = [
        f"Device: {doc['device']}; torch {doc['torch']}; {doc['date']}; device-to-device copy "
        f"{doc['copy_TBps']:.2f} TB/s (measured in this run).",
        "",
        "| workload | size | contender | ms | TB/s | % of copy | x torch.compile | host us | first call s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows(clean(doc)):
        err = f" FAILED: {r['error']}" if r["error"] else ""
        if r["fallbacks"]:
            err += f" ({r['fallbacks']} segment{'s' if r['fallbacks'] > 1 else ''} on the reference backend)"
        lines.append(
            f"| {r['workload']} | {r['size']} | {r['contender']}{err} | {_fmt(r['ms'], '.4f')} | {_fmt(r['TBps'], '.2f')} | "
            f"{_fmt(r['pct_copy'], '.0f')} | {_fmt(r['vs_torch_compile'], '.2f')} | {_fmt(r['host_us'], '.1f')} | "
            f"{_fmt(r['compile_s'], '.2f')} |"
        )
    reasons = sorted({m for w in doc["workloads"] for m in w["results"].get("thunder+fuser", {}).get("fallbacks") or ()})
    lines += ["", "Segments of thunder+fuser that ran on the reference backend: " + ("none." if not reasons else "")]
    lines += [f"- {m}" for m in reasons]
    return "\n".join(lines) + "\n"


def write_csv(doc, path) -> None:
    all_rows = list(rows(doc))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(all_rows[0]))
        w.writeheader()
        w.writerows(all_rows)


def chart(doc, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    work = [w for w in doc["workloads"] if "host" not in w["name"]]
    large = [w for w in work if w["bytes"] >= 50 * 2**20]
    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.16
    for i, c in enumerate(CONTENDERS):
        vals = [(w["results"].get(c, {}).get("TBps") or 0) / doc["copy_TBps"] * 100 for w in large]
        ax.bar([x + i * width for x in range(len(large))], [0 if math.isnan(v) else v for v in vals], width, label=c)
    ax.axhline(85, color="gray", ls="--", lw=1)
    ax.set_xticks([x + 2 * width for x in range(len(large))])
    ax.set_xticklabels([w["name"] for w in large], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("% of device-to-device copy bandwidth")
    ax.set_title(f"Large workloads on {doc['device']} (copy {doc['copy_TBps']:.2f} TB/s = 100%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def clean(x):
    """JSON has no NaN: a failed contender's numbers become null."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x


def write_json(doc, out) -> None:
    with open(os.path.join(out, "latest.json"), "w") as f:
        json.dump(clean(doc), f, indent=1)


def write_all(doc, out) -> None:
    write_json(doc, out)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(doc))
    write_csv(doc, os.path.join(out, "results.csv"))
    try:
        chart(doc, os.path.join(out, "chart.png"))
    except Exception as e:  # noqa: BLE001 - the table and CSV still stand
        print(f"chart not drawn: {e}", file=sys.stderr)


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"
    with open(os.path.join(d, "latest.json")) as f:
        write_all(json.load(f), d)
