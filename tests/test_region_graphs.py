"""A region call's launches replayed as a graph keyed on their pointers
(``cudagraphs/region_graphs.py``): what the generated code says, when a key is captured,
replayed or launched plainly, and that whole training steps stay eager's with it. Off a
GPU the graphs are ``StandIn``'s, which check that every tensor a launch reads has its
pointer in the key; the ``cuda`` tests replay real CUDA graphs."""

from __future__ import annotations

import pytest
import thunder
import torch

import thunder_fuser
from benchmarks.model_zoo import MODELS
from benchmarks.workloads import gelu_bias
from helpers import check_vs_eager
from thunder_fuser.cudagraphs import region_graphs
from test_straight_line import GELU_SOURCE, _runners


@pytest.fixture
def stand_in(monkeypatch, torch_kernels):
    monkeypatch.setattr(region_graphs, "STAND_IN", True)
    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))


# the plain code (``test_straight_line.GELU_SOURCE``) with its launch keyed and handed over;
# the pointers the alignment guards read are the key's (read once)
GELU_GRAPHED = GELU_SOURCE.replace("""\
            or a1.data_ptr() % 16 != 0
            or a0.data_ptr() % 16 != 0):""", """\
            or (p_a1 := a1.data_ptr()) % 16 != 0
            or (p_a0 := a0.data_ptr()) % 16 != 0):""").replace("""\
    run_on_torch(part11, (a1, a0, t1, ))
""", """\
    key = (p_a1, p_a0, t1.data_ptr(), )
    def launches():
        run_on_torch(part11, (a1, a0, t1, ))
    graphs12(key, launches)
""")


def test_the_code_allocates_then_keys_the_launches_on_every_pointer_they_touch(stand_in):
    """Guards, allocations, the key (every tensor the launch reads or writes; an argument's
    pointer as its alignment guard read it), the launches as a closure the graph runs or
    replays, the outputs."""
    jfn, _ = check_vs_eager(gelu_bias, torch.randn(8, 64), torch.randn(64))
    (runner,) = _runners(jfn)
    assert runner.fast.source == GELU_GRAPHED


def test_a_key_seen_twice_is_captured_then_replayed_and_another_launches_plainly(stand_in):
    x, b = torch.randn(8, 64), torch.randn(64)
    jfn = thunder.jit(gelu_bias, executors=[thunder_fuser.fuser_ex])
    jfn(x, b)  # the plan's first call: the code is written after it
    (runner,) = _runners(jfn)
    graphs = runner.fast.__globals__["graphs12"]
    out = torch.empty(8, 64)
    calls = []
    graphs.miss = lambda key, launches, miss=graphs.miss: (calls.append(key), miss(key, launches))
    # the same pointers each call: the caller's output is kept, so allocate into a fixed place
    runner.fast.__globals__["empty_strided"] = lambda *a, **k: out
    for i in range(4):
        x.copy_(torch.randn(8, 64))
        torch.testing.assert_close(jfn(x, b), gelu_bias(x, b))
        assert region_graphs.stats["captures"] == (1 if i >= 1 else 0)
    assert region_graphs.stats["replays"] == 3 and len(calls) == 2  # seen, captured (and replayed), replayed twice
    y = torch.randn(8, 64)  # another input pointer: launched plainly, and counted
    torch.testing.assert_close(jfn(y, b), gelu_bias(y, b))
    assert region_graphs.stats["replays"] == 3 and len(graphs.graphs) == 1 and len(graphs.sighted) == 1


class _Recording:
    def __init__(self, fail=False):
        self.fail, self.captured, self.outer = fail, [], False

    def capturing(self) -> bool:
        return self.outer

    def capture(self, launches, key):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captured.append(key)

        def replay(now):
            if self.outer:
                raise RuntimeError("Cannot replay a graph while a capture is underway")
            now()

        return replay


class _Graph:
    """A captured graph whose end the tests can see (a weak reference dies with it)."""

    def __init__(self, key):
        self.key = key

    def __call__(self, now):
        now()


class _RecordingMatmuls(_Recording):
    """A backend whose graphs share one cuBLAS stream: they retire (``Retirement``)."""

    def __init__(self, retirement):
        super().__init__()
        self.retirement = retirement

    def capture(self, launches, key):
        super().capture(launches, key)
        return _Graph(key)


def test_graphs_on_a_cublas_stream_retire_and_end_all_at_once(monkeypatch):
    """A replaced graph of a launch run lives on (torch's ``CUDAGraph.reset`` would drop the
    cuBLAS workspace every other graph of its stream still uses) until ``RETIRED_MAX`` are
    kept; then, before the next capture, every graph of that stream ends, the other
    regions' too, and the region goes on capturing."""
    import gc
    import weakref

    monkeypatch.setattr(region_graphs, "CAPTURE_AT", 1)
    monkeypatch.setattr(region_graphs, "MAX_GRAPHS", 2)
    monkeypatch.setattr(region_graphs, "RETIRED_MAX", 3)
    retirement = region_graphs.Retirement()
    a = region_graphs.RegionGraphs("a", _RecordingMatmuls(retirement))
    b = region_graphs.RegionGraphs("b", _RecordingMatmuls(retirement))
    b(("b",), lambda: None)
    alive = {}
    for key in range(4):  # keys 0 and 1 replaced, and kept
        a((key,), lambda: None)
        alive[key] = weakref.ref(a.graphs[(key,)][0])
    alive["b"] = weakref.ref(b.graphs[("b",)][0])
    gc.collect()
    assert all(r() is not None for r in alive.values()) and len(retirement.retired) == 2
    a((4,), lambda: None)  # replaces key 2, the third kept: every graph ends before this capture
    gc.collect()
    assert [k for k, r in alive.items() if r() is not None] == [] and not retirement.retired
    assert list(a.graphs) == [(4,)] and not b.graphs
    ran = []
    b(("b",), lambda: ran.append(1))  # captured anew
    assert ran == [1] and list(b.graphs) == [("b",)]


def test_a_region_ending_with_its_model_retires_its_graphs_on_a_cublas_stream(monkeypatch):
    """Another model's runs may still replay over the stream's workspace: the graphs of a
    region that is collected are kept, not ended."""
    import gc
    import weakref

    monkeypatch.setattr(region_graphs, "CAPTURE_AT", 1)
    retirement = region_graphs.Retirement()
    a = region_graphs.RegionGraphs("a", _RecordingMatmuls(retirement))
    a((1,), lambda: None)
    graph = weakref.ref(a.graphs[(1,)][0])
    del a
    gc.collect()
    assert graph() is not None and retirement.retired == [graph()] and not retirement.owners


def test_a_failed_capture_launches_once_and_that_key_is_not_tried_again():
    g = region_graphs.RegionGraphs("r", _Recording(fail=True))
    ran = []
    for _ in range(4):
        g((1, 2), lambda: ran.append(1))
    assert len(ran) == 4 and g.refused == {(1, 2)} and not g.graphs


def test_a_new_graph_replaces_the_oldest_until_keys_prove_unsettled(monkeypatch):
    """Keys that settle elsewhere (something else allocated between steps) get graphs anew,
    keeping ``MAX_GRAPHS``; a region whose graphs keep being replaced before they served
    stops capturing."""
    rec = _Recording()
    g = region_graphs.RegionGraphs("r", rec)
    ran = []
    for key in range(region_graphs.MAX_GRAPHS + 2):  # seen, captured, replayed once: not useful
        for _ in range(3):
            g((key,), lambda: ran.append(1))
    assert len(ran) == 3 * (region_graphs.MAX_GRAPHS + 2) and len(rec.captured) == region_graphs.MAX_GRAPHS + 2
    assert list(g.graphs) == [(k,) for k in range(2, region_graphs.MAX_GRAPHS + 2)] and g.wasted == 2
    monkeypatch.setattr(region_graphs, "CAPTURE_AT", 1)
    for key in range(100, 100 + region_graphs.MAX_WASTED):
        g((key,), lambda: None)
    assert g.wasted == region_graphs.MAX_WASTED
    before = len(rec.captured)
    g((1000,), lambda: ran.append("plain"))
    assert len(rec.captured) == before and ran[-1] == "plain"


def test_graphs_that_served_are_replaced_without_counting_against_the_region(monkeypatch):
    """A loop that evaluates every so many steps moves every key now and then: each new
    steady state gets its graphs, however many times that happens."""
    monkeypatch.setattr(region_graphs, "CAPTURE_AT", 1)
    rec = _Recording()
    g = region_graphs.RegionGraphs("r", rec)
    states = 2 * (region_graphs.MAX_WASTED + region_graphs.MAX_GRAPHS)
    for key in range(states):
        for _ in range(1 + region_graphs.USEFUL):
            g((key,), lambda: None)
    assert len(rec.captured) == states and g.wasted == 0 and len(g.graphs) == region_graphs.MAX_GRAPHS


def test_inside_a_whole_step_capture_a_region_launches_plainly():
    """``graphs.graphed`` captures a whole step: a region's launches belong in that graph, so
    it neither captures nor replays its own."""
    rec = _Recording()
    g = region_graphs.RegionGraphs("r", rec)
    for _ in range(3):
        g((1,), lambda: None)
    assert rec.captured == [(1,)]
    ran = []
    with region_graphs.suspended():
        g((1,), lambda: ran.append("plain"))
        g((2,), lambda: ran.append("plain"))
        g((2,), lambda: ran.append("plain"))
    assert ran == ["plain"] * 3 and rec.captured == [(1,)]


def test_inside_a_graph_someone_else_captures_a_region_launches_plainly():
    """thunder's ``CUDAGraphTransform`` (or a caller's ``torch.cuda.graph``) may capture a
    region call: its launches belong in that graph, so the region neither captures (its side
    stream would join the outer capture) nor replays (torch refuses a replay there)."""
    rec = _Recording()
    g = region_graphs.RegionGraphs("r", rec)
    for _ in range(2):
        g((1,), lambda: None)
    assert rec.captured == [(1,)]
    rec.outer = True
    ran = []
    for key in ((1,), (2,), (2,), (2,)):
        g(key, lambda: ran.append("plain"))
    assert ran == ["plain"] * 4 and rec.captured == [(1,)]


def test_the_stand_in_refuses_a_launch_that_reads_a_tensor_outside_the_key():
    t, u = torch.zeros(4), torch.zeros(4)

    def launches():
        t.add_(1)
        u.add_(1)

    with pytest.raises(AssertionError, match="not among the key"):
        region_graphs.StandIn().capture(launches, (t.data_ptr(),))


def test_a_copy_of_a_tensor_a_later_launch_writes_in_place_is_made_before_that_launch(stand_in):
    """``a.contiguous()`` of a strided ``a``, then ``a.mul_(a)``: a copy that may run after
    the launches (it reads their values) read ``a`` already squared (found on the H200 by
    the random programs). Such a region keeps its plain code."""
    def f(a):
        t0 = a / (a.abs() + 1)
        t2 = a.contiguous()
        t5 = (a - t0).contiguous()
        a.mul_(a)
        return t5, t2

    for _ in range(3):  # the code is written after the first call; a key is captured at its second
        jfn, _ = check_vs_eager(f, torch.randn(2, 4)[:, ::2])
    (runner,) = _runners(jfn)
    assert "key" not in runner.fast.source


def test_turned_off_the_code_launches_as_before(stand_in, monkeypatch):
    monkeypatch.setenv("THUNDER_FUSER_REGION_GRAPHS", "0")
    jfn, _ = check_vs_eager(gelu_bias, torch.randn(8, 64), torch.randn(64))
    (runner,) = _runners(jfn)
    assert "key" not in runner.fast.source and "run_on_torch(part11, (a1, a0, t1, ))" in runner.fast.source


@pytest.mark.parametrize("name", MODELS)
def test_training_steps_with_region_graphs_match_eager(name, stand_in):
    """Four steps (the code is written after the first; a key is captured at its second
    sighting): loss and gradients as eager's, no fallback. A region whose launches would
    read a copy made before them, or whose torch ops read values between launches, keeps
    its plain code (transformers' ``.contiguous()`` copies: a region without launches)."""
    from test_models import _step_matches_eager

    assert _step_matches_eager(name, "cpu", torch.float32, thunder_fuser.executors(), 1e-4, steps=4) == []
    assert region_graphs.stats["failed"] == 0


@pytest.mark.cuda
def test_training_steps_replay_region_graphs_on_the_gpu(monkeypatch):
    """bf16 on kernels, five steps: eager's loss and gradients while regions replay CUDA
    graphs (a steady step allocates at the same addresses, so keys repeat). The other
    models' cuda step test (``test_models.py``, four steps) replays wherever keys repeat.
    Without launch runs: a run's graph is keyed on all its members' pointers, and these five
    steps, each keeping its loss, move some of them (H100: no capture in five steps; the
    runs' own test, ``test_launch_runs.py``, replays them in a steady loop)."""
    from test_models import _step_matches_eager

    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))
    assert _step_matches_eager("pythia-410m", "cuda", torch.bfloat16, thunder_fuser.executors(), 3e-2, steps=5,
                               transforms=thunder_fuser.transforms(launch_runs=False)) == []
    assert region_graphs.stats["failed"] == 0
    assert region_graphs.stats["captures"] > 0 and region_graphs.stats["replays"] > region_graphs.stats["captures"], \
        region_graphs.stats


@pytest.mark.cuda
def test_captures_with_matmuls_share_one_stream_and_its_cublas_workspace(monkeypatch):
    """cuBLAS allocates a workspace per stream at the stream's first matmul (32 MiB on the
    H100): the graphs of launch runs (``launch_run.py``), captured on streams of their own,
    kept one each. On the one matmul capture stream only the first capture may allocate it,
    and every replay computes the matmul at its pointers."""
    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))
    a = torch.randn(256, 256, device="cuda")
    outs = [torch.empty(256, 256, device="cuda") for _ in range(4)]
    torch.mm(a, a, out=outs[0])  # the current stream's own workspace
    torch.cuda.synchronize()
    grown = []
    for i, out in enumerate(outs):
        graphs = region_graphs.RegionGraphs(f"mm{i}", matmuls=True)
        start = torch.cuda.memory_allocated()
        for _ in range(region_graphs.CAPTURE_AT + 1):
            out.zero_()
            graphs((a.data_ptr(), out.data_ptr()), lambda out=out: torch.mm(a, a, out=out))
            torch.testing.assert_close(out, a @ a, rtol=1e-4, atol=1e-4)
        grown.append(torch.cuda.memory_allocated() - start)
    assert {k: region_graphs.stats[k] for k in ("captures", "replays", "failed")} == {"captures": 4, "replays": 8, "failed": 0}
    assert grown[1:] == [0, 0, 0], grown


@pytest.mark.cuda
def test_a_replaced_matmul_graph_leaves_the_others_their_cublas_workspace(monkeypatch):
    """torch's ``CUDAGraph.reset`` drops the cuBLAS workspaces of the stream it captured on
    (pytorch#175276), which other graphs captured there still use (pytorch#193402): a
    launch run's graph replaced or collected must leave them a workspace no other tensor
    takes. A matmul of a long inner dimension (cuBLAS splits it, through the workspace) is
    captured by two regions; the first region's graphs go, the allocator's cache is
    emptied and refilled with a pattern, and the second region's replays must still be
    right and leave the pattern alone."""
    import gc

    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))
    a, b = torch.randn(64, 1 << 16, device="cuda"), torch.randn(1 << 16, 64, device="cuda")
    outs = [torch.empty(64, 64, device="cuda") for _ in range(2)]
    first = region_graphs.RegionGraphs("first", matmuls=True)
    second = region_graphs.RegionGraphs("second", matmuls=True)
    for graphs, out in zip((first, second), outs):
        for _ in range(region_graphs.CAPTURE_AT + 1):
            graphs((a.data_ptr(), b.data_ptr(), out.data_ptr()), lambda out=out: torch.mm(a, b, out=out))
    assert region_graphs.stats["captures"] == 2, region_graphs.stats
    del first
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    pattern = torch.full((64 << 20,), 7.0, device="cuda")  # 256 MiB over whatever was freed
    want = a @ b
    for _ in range(3):
        outs[1].zero_()
        second((a.data_ptr(), b.data_ptr(), outs[1].data_ptr()), lambda: torch.mm(a, b, out=outs[1]))
        torch.cuda.synchronize()
        torch.testing.assert_close(outs[1], want, rtol=1e-3, atol=1e-2)
    assert bool((pattern == 7.0).all())
    assert region_graphs.stats["replays"] >= 5, region_graphs.stats
