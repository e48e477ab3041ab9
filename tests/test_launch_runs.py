"""Launch runs (``thunder_transforms/launch_runs.py``, ``cudagraphs/launch_run.py``): region calls and the matmuls
between them hand over their launches, and the run replays them as one graph keyed on all
their pointers. What the trace says, that every value is eager's, that nothing launches out
of order (a member that cannot hand over flushes the run first), and the bookkeeping of a
run's graphs. Off a GPU the graphs are ``region_graphs.StandIn``'s, which check that every
tensor a launch reads has its pointer in the key; the ``cuda`` test replays real graphs."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser
from benchmarks.model_zoo import MODELS
from thunder_fuser.thunder_transforms.launch_runs import LaunchRuns
from thunder_fuser.cudagraphs import region_graphs
from thunder_fuser.cudagraphs.launch_run import LaunchRun
from test_straight_line import _runners


@pytest.fixture
def stand_in(monkeypatch, torch_kernels):
    monkeypatch.setattr(region_graphs, "STAND_IN", True)
    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))


def mlp(x, w1, b1, w2):
    h = F.gelu(F.linear(x, w1, b1))
    return F.linear(h, w2).relu() * 2


def _jit(fn):
    return thunder.jit(fn, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms(launch_runs=True))


def _mlp_args():
    return torch.randn(4, 8, 16), torch.randn(32, 16), torch.randn(32), torch.randn(16, 32)


def _mlp_calls() -> tuple:
    """``mlp`` jitted and checked against eager, and its trace's lines that call something."""
    jfn = _jit(mlp)
    args = _mlp_args()
    torch.testing.assert_close(jfn(*args), mlp(*args))
    return jfn, _calls(jfn)


def _calls(jfn) -> list[str]:
    """The trace's lines that call something, comments and the signature left out."""
    src = str(thunder.last_traces(jfn)[-1])
    lines = [ln.strip() for ln in src.splitlines()[src.splitlines().index("def computation(x, w1, b1, w2):") + 1:]]
    return [ln.split("  #")[0] for ln in lines if ln and not ln.startswith("#")]


def _fixed_pointers(jfn, monkeypatch) -> None:
    """Every allocation of ``jfn``'s regions and runs at a fixed place, one tensor per shape,
    as a steady CUDA step allocates: the same pointers each call."""
    from thunder_fuser.cudagraphs import launch_run

    pool: dict = {}

    def fixed(shape, strides=None, *, dtype, device):
        shape = tuple(shape)
        if (shape, strides) not in pool:
            pool[shape, strides] = torch.empty_strided(shape, strides or torch.empty(shape).stride(), dtype=dtype)
        return pool[shape, strides]

    monkeypatch.setattr(launch_run, "_empty", lambda shape, dtype, device: fixed(shape, None, dtype=dtype, device=device))
    for r in _runners(jfn):
        r.fast.__globals__["empty_strided"] = fixed


def _fresh_calls_match_eager(jfn, args, calls: int = 4) -> None:
    """``calls`` calls of ``jfn`` (``mlp`` jitted), each on fresh values in ``args``' tensors,
    against eager."""
    for _ in range(calls):
        for a in args:
            a.copy_(torch.randn_like(a))
        torch.testing.assert_close(jfn(*args).clone(), mlp(*args))


def _graph_counts() -> dict:
    """Graphs captured, replayed and failed (not the keys sighted, which a run's members'
    own graphs add to)."""
    return {k: region_graphs.stats[k] for k in ("captures", "replays", "failed")}


def test_the_trace_shows_the_run_its_members_and_the_flush(stand_in):
    jfn, calls = _mlp_calls()
    assert calls == [
        "run0_begin()",
        "t20 = run0_linear(x, w1, b1)",
        "(t27,) = fuser0(t20)",
        "del t20",
        "t28 = run0_linear(t27, w2, None)",
        "del t27",
        "(t9,) = fuser1(t28)",
        "del t28",
        "run0_flush()",
        "return (t9,)",
    ]
    src = str(thunder.last_traces(jfn)[-1])
    assert "# t20 = torch.nn.functional.linear(x, w1, b1)" in src  # the op it stands for, under it
    assert "# run0: linear t20, fuser0, linear t28, fuser1: launched as one CUDA graph keyed on their pointers" in src


def test_values_are_eagers_call_after_call_and_the_run_replays_its_graph(stand_in, monkeypatch):
    """The same pointers each call (every allocation at a fixed place, as a steady CUDA step
    allocates): the run's key repeats, is captured at its second sighting and replayed; the
    stand-in checks each replay reads only tensors at the key's pointers."""
    jfn = _jit(mlp)
    args = _mlp_args()
    jfn(*args)  # the regions' code is written after their first call
    _fixed_pointers(jfn, monkeypatch)
    _fresh_calls_match_eager(jfn, args)
    assert _graph_counts() == {"captures": 1, "replays": 3, "failed": 0}


def test_a_run_flushes_after_the_del_past_which_it_would_hold_too_much(stand_in, monkeypatch):
    """A deferred launch holds what it reads: where the trace deletes more of that than
    ``HELD_BYTES``, the run ends there (flushed, so it is freed where it was) and the rest
    makes a run of its own where it still has two launching calls."""
    from thunder_fuser.cudagraphs import launch_run

    monkeypatch.setattr(launch_run, "HELD_BYTES", 0)
    assert _mlp_calls()[1] == [
        "run0_begin()",
        "t20 = run0_linear(x, w1, b1)",
        "(t27,) = fuser0(t20)",
        "del t20",
        "run0_flush()",
        "t28 = torch.nn.functional.linear(t27, w2, None)",
        "del t27",
        "(t9,) = fuser1(t28)",
        "del t28",
        "return (t9,)",
    ]


@pytest.mark.parametrize("held", [0, 1 << 30], ids=["large", "small"])
def test_a_dead_input_the_runs_launches_hold_is_written_over_once_launched_if_large(stand_in, monkeypatch, held):
    """The linear's launch, pending in the run, holds its output; the region after it is
    the last to read it. A large one is still written over once the run has launched what
    it held (a run must not cost the memory donation saves: ``runtime/donation.py``); a
    small one is not, and the run goes on."""
    from thunder_fuser.cudagraphs import launch_run
    from thunder_fuser.runtime import straight_line

    monkeypatch.delenv("THUNDER_FUSER_DONATE", raising=False)
    seen, flushes = [], []
    real = straight_line.donated
    monkeypatch.setattr(straight_line, "donated", lambda t, wrapped=0: seen.append(real(t, wrapped + 1)) or seen[-1])
    flush = LaunchRun.flush
    monkeypatch.setattr(LaunchRun, "flush", lambda self: (flushes.append(len(self.parts)), flush(self))[1])

    def f(x, w1, w2):
        h = F.linear(x, w1)
        return F.linear(h * 2 + 1, w2)

    jfn = _jit(f)
    args = torch.randn(8, 16), torch.randn(16, 16), torch.randn(4, 16)
    jfn(*args)  # the trace's runs as they are (``HELD_BYTES`` also splits them there)
    monkeypatch.setattr(launch_run, "HELD_BYTES", held)
    flushes.clear()
    seen.clear()
    for _ in range(2):
        torch.testing.assert_close(jfn(*args), f(*args))
    assert seen == [held == 0] * 2
    assert flushes == ([1, 2] * 2 if held == 0 else [3] * 2)


def test_runs_are_made_unless_turned_off(stand_in, monkeypatch):
    """On by default (``thunder_fuser.transforms``); ``THUNDER_FUSER_LAUNCH_RUNS=0`` or
    ``transforms(launch_runs=False)`` turns them off."""
    args = _mlp_args()
    for env, made in ((None, True), ("", True), ("1", True), ("0", False)):
        if env is None:
            monkeypatch.delenv("THUNDER_FUSER_LAUNCH_RUNS", raising=False)
        else:
            monkeypatch.setenv("THUNDER_FUSER_LAUNCH_RUNS", env)
        jfn = thunder.jit(mlp, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
        torch.testing.assert_close(jfn(*args), mlp(*args))
        assert ("run0_flush" in str(thunder.last_traces(jfn)[-1])) == made, env
    monkeypatch.delenv("THUNDER_FUSER_LAUNCH_RUNS", raising=False)
    assert not any(isinstance(t, LaunchRuns) for t in thunder_fuser.transforms(launch_runs=False))


def test_on_the_cpu_without_region_graphs_there_is_no_run(torch_kernels):
    jfn = _jit(mlp)
    args = _mlp_args()
    torch.testing.assert_close(jfn(*args), mlp(*args))
    assert "run0" not in str(thunder.last_traces(jfn)[-1])


# ---- the run's own ops: a value is the op's once flushed, and what they read was written ----
def _pending_write(run: LaunchRun, dst: torch.Tensor, src: torch.Tensor) -> None:
    """A launch the run holds that writes ``src`` into ``dst`` (what a region hands over)."""
    run.defer((dst.data_ptr(), src.data_ptr()), lambda: dst.copy_(src))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_is_atens_on_a_contiguous_input_once_flushed(stand_in, bias):
    run = LaunchRun("r")
    x, w, b = torch.randn(3, 5, 16), torch.randn(8, 16), torch.randn(8) if bias else None
    out = run.linear(x, w, b)
    assert out.shape == (3, 5, 8) and out.is_contiguous()
    run.flush()
    torch.testing.assert_close(out, F.linear(x, w, b))


def test_a_linear_whose_input_is_not_contiguous_flushes_what_writes_it_first(stand_in):
    run = LaunchRun("r")
    x, src, w = torch.zeros(16, 12), torch.randn(16, 12), torch.randn(8, 16)
    _pending_write(run, x, src)
    out = run.linear(x.t(), w)  # torch's linear reads x now: the pending write must be made
    torch.testing.assert_close(out, F.linear(src.t(), w))
    assert not run.parts


def test_a_matmul_is_mm_and_one_without_a_unit_stride_flushes_first(stand_in):
    run = LaunchRun("r")
    a, b = torch.randn(6, 4), torch.randn(4, 5)
    out = run.matmul(a, b.t().contiguous().t())  # a column-major operand: cuBLAS reads it as it is
    run.flush()
    torch.testing.assert_close(out, a @ b)
    big, src = torch.zeros(6, 8), torch.randn(6, 8)
    _pending_write(run, big, src)
    out = run.matmul(big[:, ::2], b)  # no unit stride: torch copies it first, so it must be written
    torch.testing.assert_close(out, src[:, ::2] @ b)


def test_a_reshape_is_a_view_where_one_exists_else_a_copy_of_written_values(stand_in):
    run = LaunchRun("r")
    x, src = torch.zeros(4, 6), torch.randn(4, 6)
    _pending_write(run, x, src)
    v = run.reshape(x, (2, 12))
    assert v._base is x and run.parts  # nothing read: still pending
    c = run.reshape(x.t(), (24,))  # a copy: made of the written values
    torch.testing.assert_close(c, src.t().reshape(24))
    assert not run.parts


def test_begin_drops_what_a_call_that_raised_left_behind(stand_in):
    run = LaunchRun("r")
    x = torch.zeros(3)
    _pending_write(run, x, torch.ones(3))
    run.begin()
    run.flush()
    assert x.eq(0).all()


def test_a_region_that_cannot_hand_over_flushes_the_run_before_it_launches(stand_in):
    """A region's first call takes the general path (its plan is built then): the linear
    before it, held by the run, must be launched before the region reads its output."""
    jfn = _jit(mlp)
    args = _mlp_args()
    torch.testing.assert_close(jfn(*args), mlp(*args))
    runners = _runners(jfn)
    assert runners and all(r.run is not None and "defer" in r.fast.source for r in runners)  # handed over since


@pytest.mark.parametrize("name", MODELS)
def test_training_steps_with_launch_runs_match_eager(name, stand_in):
    """Four steps of each model with runs (the regions' code is written after the first
    call, a key is captured at its second sighting): loss and gradients as eager's, no
    fallback, and the stand-in's check of every key it replays."""
    from test_models import _step_matches_eager

    assert _step_matches_eager(name, "cpu", torch.float32, thunder_fuser.executors(), 1e-4, steps=4,
                               transforms=thunder_fuser.transforms(launch_runs=True)) == []
    assert region_graphs.stats["failed"] == 0


@pytest.mark.cuda
def test_training_steps_replay_launch_runs_on_the_gpu(monkeypatch):
    """bf16 on kernels, pythia: five steps of eager's loss and gradients with the runs (a
    forward's region calls and linears, a backward's regions and matmuls) holding several
    members each; then a steady loop, which keeps nothing between steps as a training loop
    does (the five steps keep each loss, so their allocations move), replays the runs'
    graphs, and its last step's gradients are still eager's."""
    from test_models import _models, _step_matches_eager

    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))
    calls = []
    flush = LaunchRun.flush
    monkeypatch.setattr(LaunchRun, "flush", lambda self: (calls.append(len(self.parts)), flush(self))[1])
    assert _step_matches_eager("pythia-410m", "cuda", torch.bfloat16, thunder_fuser.executors(), 3e-2, steps=5,
                               transforms=thunder_fuser.transforms(launch_runs=True)) == []
    assert max(calls) >= 8, calls  # a run holds several members' launches
    ours, ref = _models("pythia-410m", "cuda", torch.bfloat16)
    from benchmarks.model_zoo import batch

    idx, targets = batch(ours, 2, 32, "cuda")
    ref.module(idx, targets).backward()
    jfn = _jit(ours.module)
    for _ in range(8):
        for p in ours.module.parameters():
            p.grad = None
        jfn(idx, targets).backward()
    assert region_graphs.stats["failed"] == 0
    assert region_graphs.stats["replays"] > region_graphs.stats["captures"] > 0, region_graphs.stats
    for (name, p), q in zip(ours.module.named_parameters(), ref.module.parameters()):
        err = ((p.grad.float() - q.grad.float()).norm() / (q.grad.float().norm() + 1e-12)).item()
        assert err < 3e-2, f"gradient of {name} off by {err:.2e} after replays"


@pytest.mark.cuda
def test_a_loop_that_keeps_its_losses_replays_the_runs(monkeypatch):
    """Runs are on by default, so a training loop as users write it must replay them: the
    README's demo keeps each step's loss (``losses.append(loss.item())``, and ``loss`` still
    names the last one while the next step runs), and sets gradients to None. A run's graph
    is keyed on all its members' pointers: a loop whose allocations never settle captures
    graphs it never replays, and its regions fall back to their own graphs (no faster than
    without runs)."""
    from benchmarks.model_zoo import batch
    from test_models import _models

    monkeypatch.setattr(region_graphs, "stats", dict.fromkeys(region_graphs.stats, 0))
    ours, ref = _models("pythia-410m", "cuda", torch.bfloat16)
    idx, targets = batch(ours, 2, 32, "cuda")
    want = ref.module(idx, targets)
    jfn = thunder.jit(ours.module, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    losses = []
    for _ in range(12):
        for p in ours.module.parameters():
            p.grad = None
        loss = jfn(idx, targets)
        loss.backward()
        losses.append(loss.item())
    assert "run0_flush" in str(thunder.last_traces(jfn)[-1])
    assert region_graphs.stats["failed"] == 0
    assert region_graphs.stats["replays"] > 2 * region_graphs.stats["captures"] > 0, region_graphs.stats
    assert abs(losses[-1] - want.item()) < 3e-2 * max(1.0, abs(want.item()))


def test_a_run_whose_graph_is_not_replayed_launches_its_regions_through_their_own_graphs(stand_in, monkeypatch):
    """A run's graph is keyed on all its members' pointers: where those never settle (a
    loop whose allocations drift) it is not replayed, and each region member replays its
    own graph, keyed on its own pointers, as outside a run; the linears launch plainly."""
    jfn = _jit(mlp)
    args = _mlp_args()
    jfn(*args)  # the regions' code is written after their first call
    runs = {v.__self__ for v in thunder.last_traces(jfn)[-1].python_ctx().values()
            if isinstance(getattr(v, "__self__", None), LaunchRun)}
    assert len(runs) == 1
    for run in runs:  # as a run that gave up capturing (``MAX_WASTED`` graphs never useful)
        run.graphs.wasted = region_graphs.MAX_WASTED
    _fixed_pointers(jfn, monkeypatch)
    _fresh_calls_match_eager(jfn, args)
    # fuser0 and fuser1: seen, captured (and replayed), replayed twice
    assert _graph_counts() == {"captures": 2, "replays": 6, "failed": 0}
