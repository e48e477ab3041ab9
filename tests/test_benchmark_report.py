"""The benchmark report (CPU): a contender that failed is reported with its error in every
artifact, never dropped, and latest.json keeps the shape the harness promises."""

import csv
import json
import math

import pytest

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


def test_segments_on_the_reference_backend_are_reported(tmp_path):
    """The suite records the fuser's fallback warnings: a workload whose segment ran on torch
    says so beside its numbers, and the reasons are listed under the table."""
    doc = _doc()
    fuser = {"ms": 0.5, "TBps": 2.0, "host_us": None, "compile_s": 0.4,
             "fallbacks": ["thunder_fuser: fuser0 segment 1 (resize) runs on the reference backend: interior padding"]}
    doc["workloads"][0]["results"]["thunder+fuser"] = fuser
    report.write_all(doc, str(tmp_path))
    md = (tmp_path / "results.md").read_text()
    assert "| thunder+fuser (1 segment on the reference backend) |" in md
    assert md.rstrip().endswith("- " + fuser["fallbacks"][0])
    assert [r["fallbacks"] for r in csv.DictReader((tmp_path / "results.csv").open())][-1] == "1"
    doc["workloads"][0]["results"]["thunder+fuser"]["fallbacks"] = []
    assert "Segments of thunder+fuser that ran on the reference backend: none." in report.markdown(doc)


def test_a_step_gone_wrong_during_the_timed_turns_is_the_contenders_error():
    """After the timing each contender's step is checked against eager's again: a wrong
    result, or a step that raises, becomes its error; a contender that failed earlier keeps
    its first error, and is not stepped again."""
    from benchmarks.models import check_after_turns

    ran = []
    right, wrong, raising, failed = ({"error": None}, {"error": None}, {"error": None},
                                     {"error": "wrong result: loss 1.0 against eager's 2.0"})
    checks = [(right, lambda: ran.append("right")), (wrong, lambda: "gradient of w off by 1.00e+00"),
              (raising, lambda: 1 / 0), (failed, lambda: ran.append("failed"))]
    check_after_turns(checks)
    assert right["error"] is None and ran == ["right"]
    assert wrong["error"] == "wrong result after the timed turns: gradient of w off by 1.00e+00"
    assert raising["error"] == "wrong result after the timed turns: ZeroDivisionError: division by zero"
    assert failed["error"] == "wrong result: loss 1.0 against eager's 2.0"


def test_memory_is_read_once_a_step_captures_and_sights_no_graph(monkeypatch):
    """A contender's first graph with a matmul allocates its capture stream's cuBLAS
    workspace, which the training loop then holds. A key is captured at its second
    sighting, so the steps before the first capture capture nothing either (H100, pythia:
    memory read there missed the workspace). Two steps after the first, then until a step
    neither captures nor sights a key."""
    from benchmarks import models
    from thunder_fuser.cudagraphs import region_graphs

    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))
    # (steps that sight keys, then steps that capture): steps settle runs
    for sighting, capturing, steps in ((0, 0, 2), (0, 3, 4), (2, 3, 6), (100, 0, models.SETTLE_MAX),
                                       (0, 100, models.SETTLE_MAX)):
        ran = []

        def step():
            ran.append(1)
            n = len(ran)
            region_graphs.stats["sighted"] += n <= sighting
            region_graphs.stats["captures"] += sighting < n <= sighting + capturing
            return n

        assert models.settle(step)[0] == steps and len(ran) == steps


def test_held_memory_reads_a_contenders_graph_pools_whole():
    """A CUDA graph's pool is its own while the graph lives, and torch.compile
    reduce-overhead's replays write outputs and gradients there without allocating: the
    pools a contender made count with all their segments, its allocations in them once,
    and pools that were there before (another contender's) not at all."""
    from benchmarks.models import graph_pools, with_pools
    from benchmarks.models_report import table

    MiB = 1 << 20
    snapshot = [{"segment_pool_id": (0, 0), "total_size": 20 * MiB, "allocated_size": 12 * MiB},
                {"segment_pool_id": (1, 5), "total_size": 40 * MiB, "allocated_size": 32 * MiB},
                {"segment_pool_id": (1, 7), "total_size": 60 * MiB, "allocated_size": 2 * MiB},
                {"segment_pool_id": (1, 7), "total_size": 2 * MiB, "allocated_size": 0}]
    pools = graph_pools(snapshot)
    assert pools == {(1, 5): (40 * MiB, 32 * MiB), (1, 7): (62 * MiB, 2 * MiB)}
    assert with_pools(100 * MiB, {(1, 5): (40 * MiB, 32 * MiB)}, pools) == 160 * MiB
    assert with_pools(100 * MiB, pools, pools) == 100 * MiB
    row = {"step_ms": 1.0, "held_GiB": 0.143, "held_with_pools_GiB": 0.9}
    same = {"step_ms": 1.0, "held_GiB": 0.478, "held_with_pools_GiB": 0.479}
    md = table([{"name": "m", "contenders": {"torch.compile": same, "torch.compile reduce-overhead": row}}])
    assert "| 0.143 (0.9) |" in md and "| 0.478 |" in md


def test_the_model_benchmark_writes_the_schema_other_tools_read(tmp_path, monkeypatch):
    """``benchmarks.models`` on the CPU (tiny models: the harness's smoke test) and its merge:
    ``models.json`` as issue 30 specifies it, ``models.md`` with every contender's row, a
    contender named twice as ``NAME #2``."""
    pytest.importorskip("litgpt")
    from benchmarks import models

    for var in ("THUNDER_FUSER_CACHE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)  # the run sets them: undone after the test

    models.main(["--tiny", "--out", str(tmp_path / "run"), "--models", "pythia-410m", "--contenders",
                 "eager,thunder+fuser,eager", "--seq", "16", "--steps", "1", "--warm-first-calls", "yes"])
    models.main(["--merge", str(tmp_path / "run"), "--results", str(tmp_path / "results")])
    data = json.loads((tmp_path / "results" / "models.json").read_text())
    assert set(data) == {"device", "models"}
    (m,) = data["models"]
    assert m["name"] == "pythia-410m" and m["config"]["parallel_residual"] is True
    fuser = m["contenders"]["thunder+fuser"]
    for key in ("step_ms", "tokens_per_s", "first_call_s", "fallbacks", "error"):
        assert key in fuser, key
    assert fuser["error"] is None and fuser["fallbacks"] == [] and fuser["first_call_warm_s"] > 0
    assert "first_call_warm_s" not in m["contenders"]["eager"]  # a second process for the compilers only
    table = (tmp_path / "results" / "models.md").read_text()
    assert "| pythia-410m | thunder+fuser |" in table and "| pythia-410m | eager |" in table
    # a contender named again (an order test) keeps both runs
    assert list(m["contenders"]) == ["eager", "thunder+fuser", "eager #2"] and "| pythia-410m | eager #2 |" in table


def test_a_merge_keeps_the_device_line_of_the_results_it_joins(tmp_path):
    """Merging a run of some models into results that hold others keeps the results'
    device line where the run names none, and takes the run's where it does."""
    from benchmarks.models_report import merge

    def model(name, device=None):
        m = {"name": name, "config": {}, "contenders": {"eager": {"step_ms": 1.0, "error": None}}}
        return m if device is None else {**m, "device": device}

    results, run = tmp_path / "results", tmp_path / "run"
    results.mkdir()
    run.mkdir()
    (results / "models.json").write_text(json.dumps({"device": "H100 (earlier)", "models": [model("a")]}))
    (run / "models-b.json").write_text(json.dumps(model("b")))
    merge([str(run)], str(results))
    data = json.loads((results / "models.json").read_text())
    assert data["device"] == "H100 (earlier)" and [m["name"] for m in data["models"]] == ["a", "b"]
    assert "H100 (earlier)" in (results / "models.md").read_text()
    (run / "models-b.json").write_text(json.dumps(model("b", "H100 (this run)")))
    merge([str(run)], str(results))
    assert json.loads((results / "models.json").read_text())["device"] == "H100 (this run)"


def test_a_decode_contender_named_twice_keeps_both_runs(tmp_path):
    """``benchmarks.decode`` with a contender named again (an order test: does a contender
    run after torch.compile's run slower?) reports both runs, the second as ``NAME #2``, each
    checked against the first eager run."""
    from benchmarks import decode

    decode.main(["--out", str(tmp_path), "--steps", "3", "--layers", "1", "--contenders", "eager,eager"])
    runs = json.loads((tmp_path / "decode.json").read_text())["contenders"]
    assert list(runs) == ["eager", "eager #2"]
    assert runs["eager #2"]["error"] is None and runs["eager #2"]["cache_rel_err"] == 0.0


def test_several_models_run_each_in_a_process_of_its_own(tmp_path, monkeypatch, capsys):
    """What a process allocates once (a capture stream's cuBLAS workspace) counts in every
    model's memory only if each model has a process of its own; a model whose process dies
    leaves the others' results, and says so."""
    import subprocess
    import types

    from benchmarks import models

    runs = []

    def run(cmd, **kwargs):
        argv = cmd[3:]
        runs.append(argv)
        name = argv[argv.index("--models") + 1]
        if name == "b":  # its process dies: nothing written
            return types.SimpleNamespace(returncode=-11)
        (tmp_path / f"models-{name}.json").write_text(json.dumps(
            {"name": name, "config": {}, "contenders": {"eager": {"step_ms": 1.0, "error": None}}}))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(subprocess, "run", run)
    models.main(["--out", str(tmp_path), "--models", "a,b", "--contenders", "eager,thunder+fuser", "--tiny"])
    assert [r[r.index("--models") + 1] for r in runs] == ["a", "b"]
    assert all(r[r.index("--contenders") + 1] == "eager,thunder+fuser" and "--tiny" in r for r in runs)
    out = capsys.readouterr().out
    assert "[b] its process exited with -11" in out and "| a | eager |" in out and "| b |" not in out


@pytest.mark.parametrize("module", ["models", "run", "decode", "distributed", "cross_entropy", "segmentation_time",
                                    "profile_one", "warm_cache", "summary", "optimizer",
                                    "thunderfx_coverage"])
def test_every_benchmark_command_explains_itself(module, capsys):
    """issue 62: --help describes the command and each option with its default, names the
    models and contenders (the model benchmark), and runs nothing."""
    import importlib
    import runpy
    import sys

    if module == "summary":  # its command is its ``__main__`` block
        with pytest.raises(SystemExit) as exit_:
            argv, sys.argv = sys.argv, ["summary", "--help"]
            try:
                runpy.run_module("benchmarks.summary", run_name="__main__")
            finally:
                sys.argv = argv
    else:
        with pytest.raises(SystemExit) as exit_:
            importlib.import_module(f"benchmarks.{module}").main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: python -m benchmarks.{module}")
    if module == "models":
        from benchmarks.model_zoo import MODELS
        from benchmarks.models import CONTENDERS

        assert all(m in text for m in MODELS) and all(c in text for c in CONTENDERS), text
        import re

        assert re.search(r"--steps STEPS\s+timed steps .*\(default:\s+30[;)]", text, re.S), text


@pytest.mark.parametrize("master", ["none", "fp32"])
def test_the_optimizer_benchmark_steps_every_contender_alike_on_the_cpu(tmp_path, master):
    """``benchmarks.optimizer --tiny``: each contender's AdamW steps over a zoo model's
    parameters, checked against eager's, the step through us one region (issue 61)."""
    import json

    from benchmarks import optimizer

    optimizer.main(["--tiny", "--out", str(tmp_path), "--models", "Llama-3.2-1B", "--layers", "1", "--master", master,
                    "--contenders", "eager,thunderfx+fuser", "--steps", "1", "--rounds", "1"])
    name = "optimizer.json" if master == "none" else f"optimizer-master-{master}.json"
    (res,) = json.loads((tmp_path / name).read_text())["results"]
    rows = res["contenders"]
    assert set(rows) == {"eager", "thunderfx+fuser"} and not any("error" in r for r in rows.values()), rows
    assert rows["thunderfx+fuser"]["regions"] == 1 and res["master"] == master
    # what each holds a parameter: bf16, its two bf16 moments; or bf16, an fp32 master, its fp32
    # gradient and two fp32 moments (the step counts: a few bytes more)
    per_element = 2 + 2 * 2 if master == "none" else 2 + 4 + 4 + 4 * 2
    for row in rows.values():
        assert per_element * res["parameters"] <= row["held_bytes"] <= per_element * res["parameters"] + 4096, row


def test_a_gpu_benchmark_says_so_in_one_line_on_a_machine_without_one(monkeypatch):
    from benchmarks import run

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        run.main(["--out", "unused"])
    assert "needs a CUDA GPU" in str(exit_.value.code) and "\n" not in str(exit_.value.code)


def test_the_results_page_is_the_latest_results_generated():
    """``benchmarks/RESULTS.md`` is generated from the results JSON, nothing older or by hand:
    after a run, ``python -m benchmarks.results_page > benchmarks/RESULTS.md``."""
    from pathlib import Path

    from benchmarks.results_page import page

    root = Path(__file__).resolve().parent.parent
    assert (root / "benchmarks" / "RESULTS.md").read_text() == page(str(root / "benchmarks" / "results"))


@pytest.mark.parametrize("contenders, buckets", [
    # the model's step through us over two bucketed lengths in turns
    (("eager", "thunder+fuser"), "8,16"),
    # the optimizer's step through ThunderFX and our executors, and through ``thunder.jit``
    # (one length: what a length builds is the model's step, checked in the case above)
    (("thunder+fuser+step", "thunder+fuser+jitstep"), None),
])
def test_the_zoo_steps_every_contender_with_its_optimizer_on_the_cpu(tmp_path, contenders, buckets):
    """``benchmarks.zoo --tiny``: a whole training step with AdamW in the loop, each
    contender's loss, gradients and first update checked against eager's before its timed
    turns; two bucketed lengths in turns build nothing after each one's first step. Two
    cases, so that xdist spreads them (one case took 97 s alone, 309 s in the suite), and
    the optimizer's contenders step one length only (80 s for both cases alone); one layer
    (each contender's first step at 2 layers took 1.3x as long)."""
    import json

    from benchmarks import zoo

    args = ["--tiny", "--out", str(tmp_path), "--models", "hf-GPT2", "--layers", "1", "--steps", "1",
            "--contenders", ",".join(contenders)]
    zoo.main(args + (["--buckets", buckets] if buckets else []))
    res = json.loads((tmp_path / "zoo-hf-GPT2.json").read_text())
    rows = res["contenders"]
    assert set(rows) == set(contenders)
    assert all(r["error"] is None and r["step_ms"] > 0 and r["step_ms_alone"] > 0 for r in rows.values()), rows
    assert res["layers"] == 1 and res["full_depth"] == 12
    if buckets:  # bucketed lengths: each length built once, nothing again in the turns over them
        for r in rows.values():
            assert set(r["buckets"]["lengths"]) == {"8", "16"}
            assert not any(r["buckets"]["rebuilt"].values()), r["buckets"]["rebuilt"]


def test_the_zoos_update_check_tells_a_bf16_rounding_from_a_wrong_step():
    """AdamW's first step moves a bf16 weight by about half its ulp: another rounding of the
    same update passes, a step of 0.7x the learning rate or another sign does not."""
    import torch

    from benchmarks.zoo import LR, _update_error

    torch.manual_seed(0)
    w = torch.nn.Linear(256, 256, dtype=torch.bfloat16)
    before = [p.detach().float().clone() for p in w.parameters()]
    signs = [torch.randn_like(b).sign() for b in before]
    exact = [b - LR * s for b, s in zip(before, signs)]  # the update before bf16 rounds it
    want = [e.bfloat16().float() - b for e, b in zip(exact, before)]

    def moved(scale, rounding):
        with torch.no_grad():
            for p, b, s in zip(w.parameters(), before, signs):
                p.copy_(rounding(b - scale * LR * s))
        return _update_error(w, before, want)

    def up(x):  # round toward the larger bf16 neighbour
        return torch.where(x.bfloat16().float() < x, torch.nextafter(x.bfloat16(), torch.tensor(1.0, dtype=torch.bfloat16)),
                           x.bfloat16())

    assert moved(1.0, lambda x: x.bfloat16()) is None
    assert moved(1.0, up) is None
    assert "elements off" in moved(0.7, lambda x: x.bfloat16())
    assert "elements off" in moved(-1.0, lambda x: x.bfloat16())


def test_the_zoo_runs_a_process_per_model_and_gathers_their_tables(tmp_path, capsys):
    """``benchmarks.zoo_parallel``: each model in a process of its own (one GPU each where
    there are several), every model's JSON and log written, one table of all printed."""
    from benchmarks import zoo_parallel

    import tarfile

    bundle = tmp_path / "zoo.tar.gz"
    out_dir = tmp_path / "out"
    assert zoo_parallel.main(["--models", "hf-GPT2,hf-ViT", "--gpus", "2", "--out", str(out_dir), "--tiny",
                              "--steps", "1", "--contenders", "eager", "--bundle", str(bundle)]) == 0
    names = {"zoo-hf-GPT2.json", "zoo-hf-GPT2.log", "zoo-hf-ViT.json", "zoo-hf-ViT.log"}
    assert {p.name for p in out_dir.iterdir()} == names
    with tarfile.open(bundle) as tar:
        assert set(tar.getnames()) == names
    out = capsys.readouterr().out
    assert "| hf-GPT2 | 2 (12) | eager |" in out and "| hf-ViT | 2 (12) | eager |" in out


def test_the_zoo_stops_its_models_at_the_limit_and_starts_no_more(tmp_path, capsys):
    """``--limit``: a call that must end by a deadline (a lent GPU's) stops what still runs and
    reports it, and what never started, as failed."""
    from benchmarks import zoo_parallel

    assert zoo_parallel.main(["--models", "hf-GPT2,hf-ViT", "--gpus", "1", "--out", str(tmp_path), "--tiny",
                              "--steps", "1", "--contenders", "eager", "--limit", "0.5"]) == 1
    out = capsys.readouterr().out
    assert "hf-GPT2 stopped at the 0.5 s limit" in out and "hf-ViT not started: the 0.5 s limit" in out


def test_zoo_names_each_torch_kernel_outside_our_regions_and_why():
    from benchmarks.zoo import left_outside_why, short_kernel_name

    copy = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>"
    fill = "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::BFloat16>)"
    scatter = "void at::native::(anonymous namespace)::sum_and_scatter<c10::BFloat16, long>(long const*, c10::BFloat16*)"
    assert short_kernel_name(copy) == "direct_copy_kernel_cuda"
    assert short_kernel_name(fill) == "FillFunctor<c10::BFloat16>"
    assert short_kernel_name(scatter) == "sum_and_scatter"
    assert left_outside_why(copy) == "unexplained"  # a copy is ours to take: never explained away
    assert "embedding" in left_outside_why(scatter)
    # a fill is explained only by the op that launched it
    assert left_outside_why(fill) == left_outside_why(fill, "aten::add") == "unexplained"
    assert "embedding" in left_outside_why(fill, "aten::embedding_backward")
    assert "convolution" in left_outside_why(copy, "aten::convolution")  # inside an op none of ours runs


def test_zoo_ties_each_torch_kernel_to_the_op_that_launched_it():
    """Two fills of one name, one under the embedding's backward and one under an add:
    only the first is explained, and each keeps its own time."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Kernel

    from benchmarks.zoo import kernel_kinds

    fill = "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16> >"

    def host(name, parent=None, kernels=()):
        return NS(name=name, device_type=DeviceType.CPU, cpu_parent=parent, kernels=list(kernels))

    def device(start, us):
        return NS(name=fill, device_type=DeviceType.CUDA, device_time=us, time_range=NS(start=start, end=start + us))

    backward = host("aten::embedding_backward")
    dense = host("aten::embedding_dense_backward", backward)
    zeros = host("aten::zero_", host("aten::zeros", dense), [Kernel(fill, 0, 150)])
    add = host("aten::fill_", host("aten::add", host("ThunderFunction")), [Kernel(fill, 0, 7)])
    events = [backward, dense, zeros, add, device(0, 150), device(200, 7)]
    left = kernel_kinds(NS(events=lambda: events))["torch_kernels"]
    assert [(k["op"], k["ms"], k["why"] == "unexplained") for k in left] == [
        ("aten::embedding_backward", 0.15, False), ("aten::add", 0.007, True)]


def test_zoo_takes_the_launching_ops_from_a_step_profiled_with_them():
    """The zoo times a step profiled for the GPU only (recording host ops would widen its
    gaps) and reads each kernel's launching op from another step: autograd's seed of the
    loss's gradient, a one-element fill under ``aten::ones_like``, is explained by it; a
    fill of the same name in a CUDA graph (no host op) stays unexplained."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from benchmarks.zoo import kernel_kinds

    fill = "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16> >"

    def device(start, us):
        return NS(name=fill, device_type=DeviceType.CUDA, device_time=us, time_range=NS(start=start, end=start + us))

    launched_by = {fill: ["aten::ones_like"]}
    timed = NS(events=lambda: [device(0, 1), device(100, 2)])
    left = kernel_kinds(timed, launched_by)["torch_kernels"]
    assert sorted((k["op"], k["why"]) for k in left) == [
        ("", "unexplained"), ("aten::ones_like", "autograd's seed of the loss's gradient (a one-element ones_like in backward())")]
    assert launched_by == {fill: ["aten::ones_like"]}  # read, not used up: a second breakdown gets the same


def test_zoo_lists_the_matmul_kernels_by_name():
    """Two contenders' matmul columns apart: the kernels cuBLAS ran for each, with calls and time."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from benchmarks.zoo import kernel_kinds

    def device(name, start, us):
        return NS(name=name, device_type=DeviceType.CUDA, device_time=us, time_range=NS(start=start, end=start + us))

    tile = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    events = [device(tile, 0, 300), device("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN", 400, 100),
              device(tile, 600, 200), device("fuser_rows_add_kernel_cutlass_kernel_tensorptrbf16", 900, 50)]
    assert kernel_kinds(NS(events=lambda: events))["matmul_kernels"] == [
        {"name": tile, "calls": 2, "ms": 0.5}, {"name": "nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NTN", "calls": 1, "ms": 0.1}]


def test_zoo_kernels_are_told_apart_by_name():
    from benchmarks.zoo import kernel_kind

    assert kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kernel_kind("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN") == "matmul"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kernel_kind("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits"
                       "<256, 64, 64, 8, 4, 2, 2, false, false, cutlass::bfloat16_t>>") == "attention"
    assert kernel_kind("fmha_cutlassB_bf16_aligned_64x64_k128_sm80") == "attention"
    assert kernel_kind("kernel_cutlass_kernel_tensorptrbf16_gmem_align16_o_101_tensorptrbf16_gmem_align16_o_101____0") == "ours"
    # a column reduction's two kernels are ours too, not a matmul (the "cutlass" in their names)
    assert kernel_kind("kernel_cutlass_partial_tensorptrbf16_gmem_align16_o_div8i64_div81_tensorptrf32_gmem_o") == "ours"
    assert kernel_kind("kernel_cutlass_finalize_tensorptrf32_gmem_o_div8i640_tensorptrbf16_gmem") == "ours"
    assert kernel_kind("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8") == "matmul"
    assert kernel_kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") \
        == "optimizer"
    assert kernel_kind("triton_poi_fused_add_mul_0") == "triton"
    assert kernel_kind("void at::native::elementwise_kernel<128, 2>(direct_copy_kernel_cuda)") == "torch"


def test_zoo_finds_where_the_gpu_waited_between_kernels():
    from benchmarks.zoo import idle_gaps

    spans = [(0, 10, "gemm"), (5, 30, "attention"), (40, 50, "copy"), (150, 160, "sum_and_scatter"),
             (161, 170, "gemm")]
    res = idle_gaps(spans, top=2)
    assert res["gpu_idle_ms"] == 0.111
    assert res["idle_gaps"] == [{"us": 100, "after": "copy", "before": "sum_and_scatter"},
                                {"us": 10, "after": "attention", "before": "copy"}]
    assert idle_gaps([]) == {"gpu_idle_ms": 0.0, "idle_gaps": []}


def test_the_results_page_leads_with_the_zoo_where_it_ran(tmp_path):
    """A zoo run's JSON (``benchmarks.zoo``) becomes the page's first section, with the
    geometric mean of thunder + fuser against torch.compile."""
    import json

    from benchmarks.results_page import page

    row = {"step_ms": 10.0, "x_torch_compile": 1.1, "gpu_ms_by_kind": {"matmul": 6.0, "ours": 1.0}, "error": None}
    doc = {"name": "pythia-1b", "layers": 16, "full_depth": 16, "device": "GPU X", "config": {},
           "contenders": {"torch.compile": {"step_ms": 11.0, "x_torch_compile": 1.0, "error": None},
                          "thunder+fuser": row}}
    (tmp_path / "zoo-pythia-1b.json").write_text(json.dumps(doc))
    text = page(str(tmp_path))
    sections = [part.split("\n")[0] for part in text.split("\n## ")[1:]]
    assert sections[:2] == ["How these are measured", "Whole training steps of the model zoo (`python -m benchmarks.zoo`)"]
    assert "| pythia-1b | 16 (16) | thunder+fuser | 10.0 |  | 1.1 |" in text
    assert "thunder+fuser x torch.compile, geometric mean over 1 models: 1.100" in text


def test_zoo_puts_our_kernels_and_inductors_in_the_same_op_groups():
    """Ours are named by their ops (``kernel_names.py``), Inductor's by its aten ops: the same
    computation lands in the same group either way, so the page compares them group by group."""
    from benchmarks.zoo import group_table, op_group

    tail = "_kernel_cutlass_kernel_tensorptrbf16_gmem_align16_o_div8i64_div81_0"
    pairs = {
        "loss": ("fuser_rows_amax_exp_log_sub_sum_where", "triton_red_fused__log_softmax_nll_loss_forward_0"),
        "norm": ("fuser_rows_add_mean_mul_rsqrt_sum", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"),
        "activation": ("fuser_pointwise_add_exp_mul_neg_reciprocal", "triton_poi_fused_mul_silu_3"),
        "rope": ("fuser_pointwise_add_cat_mul_neg", "triton_poi_fused_add_cat_mul_neg_slice_split_with_sizes_1"),
        "optimizer": ("fuser_pointwise_group_add_div_lerp_mul_neg_pow_sqrt_sub", "triton_for_fused__foreach_addcdiv_0"),
        "other": ("fuser_pointwise_add", "triton_poi_fused_add_2"),
    }
    for group, (ours, inductors) in pairs.items():
        assert (op_group(ours + tail), op_group(inductors)) == (group, group), group
    assert op_group("fuser_rows_and_columns_add_mul_rsqrt_sum" + tail.replace("kernel_tensor", "partial_tensor")) == "norm"
    # a norm's backward, its weight's gradient summed per column or not
    assert op_group("fuser_rows_and_columns_add_div_mul_pow_sum" + tail.replace("kernel_tensor", "partial_tensor")) == \
        op_group("triton_per_fused__to_copy_add_div_expand_mul_pow_sum_view_4") == "norm"
    assert op_group("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT") == "other"  # a matmul is in no group
    from benchmarks.zoo import fused_name

    assert fused_name("fuser_columns_sum" + tail.replace("kernel_tensor", "finalize_tensor")) == \
        "fuser_columns_sum_kernel_cutlass_finalize"  # one row per kernel, whatever its operands

    run = {"name": "m", "contenders": {
        "thunder+fuser": {"gpu_ms_by_group": {"norm": {"ours": 1.5}, "rope": {"ours": 0.2}}},
        "torch.compile": {"gpu_ms_by_group": {"norm": {"triton": 1.0}, "loss": {"triton": 0.5}}}}}
    assert group_table([run]).splitlines()[2:] == [
        "| m | loss | 0.000 | 0.500 |  |", "| m | norm | 1.500 | 1.000 | 1.50 |", "| m | rope | 0.200 | 0.000 |  |"]
    # ours of a later run beside that run's torch.compile, not the first run's
    run["contenders"]["thunder+fuser"]["run"] = 2
    run["contenders"]["torch.compile (run 2)"] = {"gpu_ms_by_group": {"norm": {"triton": 3.0}}, "run": 2}
    assert group_table([run]).splitlines()[2:] == ["| m | norm | 1.500 | 3.000 | 0.50 |", "| m | rope | 0.200 | 0.000 |  |"]


def test_zoo_adds_a_second_runs_contenders_to_a_models_json():
    """A deep model's contenders in two calls (``--add``): the second run's join the first's,
    marked with their run, its torch.compile kept apart, and sizes that differ refused."""
    import pytest

    from benchmarks.zoo import added_run, shown_label

    def run(contenders, layers=28):
        return {"name": "m", "layers": layers, "config": {"n_embd": 8}, "contenders": contenders}

    first = run({"torch.compile": {"step_ms": 10.0}, "thunder+fuser": {"step_ms": 9.0, "x_torch_compile": 1.11}})
    second = run({"torch.compile": {"step_ms": 10.4}, "eager": {"step_ms": 20.0, "x_torch_compile": 0.52}})
    merged = added_run(first, second)
    assert merged["contenders"] == {
        "torch.compile": {"step_ms": 10.0}, "thunder+fuser": {"step_ms": 9.0, "x_torch_compile": 1.11},
        "torch.compile (run 2)": {"step_ms": 10.4, "run": 2}, "eager": {"step_ms": 20.0, "x_torch_compile": 0.52, "run": 2}}
    assert first["contenders"].keys() == {"torch.compile", "thunder+fuser"}  # the first run's dict is its own
    # a run on another GPU: its contenders carry it, and their labels name it
    third = dict(run({"thunder+fuser": {"step_ms": 8.0}}), device="NVIDIA H100 80GB HBM3; torch 2.11")
    again = added_run(dict(merged, device="NVIDIA H200; torch 2.11"), third)["contenders"]["thunder+fuser"]
    assert again == {"step_ms": 8.0, "run": 3, "device": "NVIDIA H100 80GB HBM3; torch 2.11"}
    assert shown_label("thunder+fuser", again) == "thunder+fuser (run 3, H100 80GB HBM3)"
    assert shown_label("torch.compile (run 2)", merged["contenders"]["torch.compile (run 2)"]) == "torch.compile (run 2)"
    with pytest.raises(SystemExit, match="other layers"):
        added_run(first, run({}, layers=8))


def test_a_model_whose_positions_end_before_the_sequence_takes_more_rows_of_its_longest():
    """GPT-2's positions end at 1024: a zoo step of 2 x 2048 tokens is 4 x 1024 for it (the
    same tokens), recorded as such, where it would index past its position table."""
    from benchmarks.model_zoo import batch, build
    from benchmarks.models import run_config

    built = build("hf-GPT2", 1, tiny=True)
    idx, targets = batch(built, 2, 2 * built.max_seq)
    assert idx.shape == targets.shape == (4, built.max_seq)
    assert built.module(idx, targets).isfinite()
    assert run_config(built, 2, 2 * built.max_seq)["seq"] == built.max_seq


def test_the_thunderfx_coverage_names_every_model_and_why_one_did_not_match(tmp_path):
    """``benchmarks.thunderfx_coverage``: a coverage run's zoo JSONs become one line a model,
    the ones that did not match eager first, with the check's words; ``--update`` keeps the
    models a second run did not step."""
    from benchmarks import thunderfx_coverage

    def zoo(folder, name, **contender):
        folder.mkdir(exist_ok=True)
        (folder / f"zoo-{name}.json").write_text(json.dumps({
            "name": name, "layers": 2, "full_depth": 16, "device": "a GPU",
            "contenders": {"thunderfx+fuser": {"error": None, "step_ms": 5.0, "kernels_per_step": 120,
                                               "gpu_ms_by_kind": {"torch": 0.3}, "fallbacks": [], **contender}}}))

    zoo(tmp_path / "run1", "right")
    zoo(tmp_path / "run1", "wrong", error="wrong result: gradient of w off by 6.20e-01")
    out = tmp_path / "coverage.json"
    assert thunderfx_coverage.main([str(tmp_path / "run1"), "--out", str(out), "--note", "two at once"]) == 0
    doc = json.loads(out.read_text())
    lines = thunderfx_coverage.table(doc).splitlines()[2:]
    assert lines[0].startswith("| wrong | 2 (16) | **no** |") and lines[0].endswith("off by 6.20e-01 |")
    assert lines[1].startswith("| right | 2 (16) | yes | 120 | 0.3 | 0 | 5.0 |")
    zoo(tmp_path / "run2", "wrong")
    thunderfx_coverage.main([str(tmp_path / "run2"), "--out", str(out), "--update"])
    doc = json.loads(out.read_text())
    assert {r["model"]: r["matches_eager"] for r in doc["models"]} == {"right": True, "wrong": True}
    assert doc["note"] == "two at once"


def test_zoo_gives_a_graphed_ops_unexplained_kernels_the_reason_of_their_run():
    """In a CUDA graph no kernel has a launching op: the embedding backward's fill and
    compaction, between its sort and its scatter with nothing of ours between, are its; a
    copy in the same run, or a fill after its last kernel or after one of ours, is not."""
    from benchmarks.zoo import EMBEDDING_BACKWARD as emb, runs_explained

    names = ["fuser_rows_kernel_cutlass", "arange_cuda_out", "Memset (Device)", "DeviceRadixSortOnesweepKernel",
             "FillFunctor<BFloat16>", "direct_copy_kernel_cuda", "DeviceCompactInitKernel", "sum_and_scatter",
             "FillFunctor<BFloat16>", "fuser_pointwise_kernel_cutlass", "FillFunctor<BFloat16>"]
    whys = [None, "unexplained", "a driver memset", emb, "unexplained", "unexplained", "unexplained", emb,
            "unexplained", None, "unexplained"]
    assert runs_explained(names, whys) == [None, emb, "a driver memset", emb, emb, "unexplained", emb, emb,
                                           "unexplained", None, "unexplained"]
    assert runs_explained(names[4:6], ["unexplained", "unexplained"]) == ["unexplained", "unexplained"]


def test_the_zoo_heading_names_each_models_gpu_where_they_differ():
    """A model first run on another GPU than the others is not reported under their GPU."""
    from benchmarks.results_page import _zoo_devices

    h200, h100 = "NVIDIA H200; torch 2.11", "NVIDIA H100 80GB HBM3; torch 2.11"
    assert _zoo_devices([{"name": "a", "device": h200}, {"name": "b", "device": h200}]) == h200
    assert _zoo_devices([{"name": "a", "device": h200}, {"name": "b", "device": h100}, {"name": "c", "device": h200}]) == (
        f"{h200} (first run of a, c); {h100} (first run of b)")


@pytest.mark.parametrize("name", ["Mistral-7B-v0.1", "Phi-3-mini-4k-instruct"])
def test_a_sliding_window_no_sequence_reaches_is_left_off_with_the_same_numbers(name):
    """litgpt builds a sliding window's mask with a slice assignment per token in every
    layer, which compilers trace op by op (torch.compile's first step at 2048 tokens had not
    ended after 8 minutes on the H100). A window at least as long as every sequence masks
    nothing the causal mask does not: the zoo builds the model without it, says so in its
    config, and the loss and gradients are the window's."""
    import torch

    from benchmarks.model_zoo import batch, build

    windowed = build(name, 1, tiny=True)
    plain = build(name, 1, tiny=True, longest=32)
    assert "sliding_window" not in windowed.config
    assert plain.config["sliding_window"].startswith("off:")
    assert not any(getattr(m, "apply_sliding_window_attention", False) for m in plain.module.modules())
    assert any(getattr(m, "apply_sliding_window_attention", False) for m in windowed.module.modules())
    idx, targets = batch(plain, 2, 32)
    want = windowed.module(idx, targets)
    got = plain.module(idx, targets)
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want)
    for p, q in zip(plain.module.parameters(), windowed.module.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    assert build(name, 1, tiny=True, longest=10**6).config.get("sliding_window") is None
