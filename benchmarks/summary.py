"""The generated part of ``benchmarks/RESULTS.md``: standings per workload from a run's
``latest.json`` and ``warm_cache.json``. The analysis of misses is written by hand below it.

    python -m benchmarks.summary benchmarks/results > /tmp/summary.md
"""

from __future__ import annotations

import json
import os

from benchmarks.report import CONTENDERS, SAME_SIZE_COPY_BELOW


def summary(doc, warm) -> str:
    copy = doc["copy_TBps"]
    lines = [
        "| workload | size | fuser TB/s | % of copy | % of a same-size copy | torch.compile TB/s | fuser / torch.compile | targets (>= 85% copy and >= 1.1x torch.compile) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for w in doc["workloads"]:
        f, c = w["results"]["thunder+fuser"], w["results"]["torch.compile"]
        if "transformer" in w["name"]:
            if w["bytes"] >= 50 * 2**20 or "8, 1024" in w["size"]:
                t = w["results"]["thunder+torchcompile"]["ms"]
                lines.append(f"| {w['name']} | {w['size']} | {f['ms']:.2f} ms | | | {c['ms']:.2f} ms | {c['ms'] / f['ms']:.2f} | "
                             f"not a bandwidth workload (matmuls, attention): ms only; thunder+torchcompile {t:.2f} ms |")
            continue
        if w["bytes"] < 50 * 2**20:
            continue
        sp, pct = c["ms"] / f["ms"], 100 * f["TBps"] / copy
        ok = "met" if pct >= 85 and sp >= 1.1 else ("bandwidth met, speedup missed" if pct >= 85 else "missed")
        small = w.get("same_size_copy_TBps") and w["bytes"] < SAME_SIZE_COPY_BELOW  # older runs measured all
        same = f"{100 * f['TBps'] / w['same_size_copy_TBps']:.0f}" if small else ""
        lines.append(f"| {w['name']} | {w['size']} | {f['TBps']:.2f} | {pct:.0f} | {same} | {c['TBps']:.2f} | {sp:.2f} | {ok} |")
    lines += ["", "Host overhead per call, small sizes (us, wall clock of 100 back-to-back calls):", "",
              "| workload | size | " + " | ".join(CONTENDERS) + " |", "| --- | --- |" + " ---: |" * len(CONTENDERS)]
    for w in doc["workloads"]:
        r = w["results"]
        if r["eager"].get("host_us") is not None:
            lines.append(f"| {w['name']} | {w['size']} | " + " | ".join(
                f"{r[k]['host_us']:.0f}" if r[k].get("host_us") is not None else "" for k in CONTENDERS) + " |")
    lines += ["", "A second process over the disk cache the run filled (`benchmarks/warm_cache.py`, large sizes):", ""]
    if "_library_import_s" in warm:
        lines += [f"Once per process, before its first kernel: importing CuTe DSL and TVM-FFI took "
                  f"{warm['_library_import_s']:.2f} s.", ""]
    lines += ["| workload | first call s (tracing included) | kernels loaded | load ms per kernel |", "| --- | ---: | ---: | ---: |"]
    for k, v in ((k, v) for k, v in warm.items() if not k.startswith("_")):
        lines.append(f"| {k} | {v['first_call_s']:.3f} | {v['kernels_loaded']} | {v['load_ms_per_kernel']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from benchmarks import cli

    ap = cli.parser("benchmarks.summary", __doc__)
    ap.add_argument("results", nargs="?", default="benchmarks/results", help="a run's folder (benchmarks.run --out)")
    d = ap.parse_args().results
    with open(os.path.join(d, "latest.json")) as f, open(os.path.join(d, "warm_cache.json")) as g:
        print(summary(json.load(f), json.load(g)))
