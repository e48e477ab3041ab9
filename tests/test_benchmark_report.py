"""The benchmark report (CPU): a contender that failed is reported with its error in every
artifact, never dropped, and latest.json keeps the shape the harness promises."""

import csv
import json
import math

from benchmarks import report


def _doc():
    ok = {"ms": 0.5, "TBps": 2.0, "host_us": None, "compile_s": 0.4}
    failed = {"ms": math.nan, "TBps": math.nan, "host_us": None, "compile_s": None,
              "error": "AssertionError: output 0 differs from eager"}
    results = {c: dict(ok) for c in report.CONTENDERS}
    results["thunder+fuser"] = failed
    return {"device": "test GPU", "date": "2026-11-21", "torch": "2.13.0", "copy_TBps": 2.9,
            "workloads": [{"name": "gelu(x + bias) bf16", "size": "[8192, 4096]", "bytes": 10**9, "results": results}]}


def test_a_failed_contender_is_reported_in_every_artifact(tmp_path):
    report.write_all(_doc(), str(tmp_path))
    doc = json.loads((tmp_path / "latest.json").read_text())
    assert sorted(doc) == ["copy_TBps", "date", "device", "torch", "workloads"]
    w = doc["workloads"][0]
    assert sorted(w) == ["bytes", "name", "results", "size"]
    assert sorted(w["results"]) == sorted(report.CONTENDERS)
    fuser = w["results"]["thunder+fuser"]
    assert fuser["ms"] is None and fuser["TBps"] is None and "differs from eager" in fuser["error"]
    assert "| thunder+fuser FAILED: AssertionError: output 0 differs from eager |" in (tmp_path / "results.md").read_text()
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == len(report.CONTENDERS)
    assert [r["contender"] for r in rows if r["error"]] == ["thunder+fuser"]
