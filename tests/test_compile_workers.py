"""Kernels compiled in worker processes while a plan's first call runs on the reference
backend (``backends/cute/compile_workers.py``): the first call's results are eager's, its
outputs in the layouts the kernels give them; from the second call every kernel runs, and
a kernel that fails to build falls back with its warning, never a wrong result.

On the CPU the workers compile real kernels to PTX (``CUTE_DSL_ARCH=sm_90a``) into the
disk cache; the plan's side runs with a stand-in compiler whose "kernels" run the lowered
programs with torch (``torch_eval``), so that the order of queueing, waiting and launching
is checked end to end."""

from __future__ import annotations

import random
import sys
import warnings

import pytest
import thunder
import torch

from benchmarks.workloads import TransformerBlock, rope
from helpers import check_vs_eager, check_vs_float64, planned_parts, plans
from hypothesis import given, settings
from hypothesis import strategies as st
from pointwise_programs import programs
from thunder_fuser import explain, fuser_ex
from thunder_fuser.backends.cute import backend, cache, compile_workers, segment_kernel
from thunder_fuser.backends.cute.backend import KernelFallbackWarning
from thunder_fuser.backends.cute.torch_eval import run_program
from thunder_fuser.runtime import plan as plan_mod
from thunder_fuser.runtime.region_runner import RegionRunner


@pytest.fixture
def workers(monkeypatch, tmp_path):
    """Two workers compiling for sm_90a into a fresh disk cache; stopped afterwards."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("THUNDER_FUSER_COMPILE_WORKERS", "2")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("THUNDER_FUSER_CACHE", str(tmp_path))
    cache.clear_memory()
    yield
    compile_workers.shutdown()
    cache.clear_memory()


def _some_parts() -> list:
    x = torch.randn(64, 256)
    return (planned_parts(lambda a: torch.softmax(a, -1), (x,))
            + planned_parts(lambda a, w: torch.nn.functional.rms_norm(a, (256,), w), (x, torch.randn(256)))
            + planned_parts(lambda a: torch.nn.functional.silu(a) * 3, (x,)))


def test_workers_compile_the_queued_kernels_and_the_caller_loads_them_from_disk(workers):
    parts = _some_parts()
    assert [segment_kernel.compile_program(p.prog, p.geo, None, defer=True) for p in parts] == [None] * len(parts)
    before = dict(cache.stats)
    fns = [segment_kernel.compile_program(p.prog, p.geo, None) for p in parts]
    assert all(fn is not None for fn in fns)
    assert cache.stats["compiled"] == before["compiled"]  # none compiled here
    assert cache.stats["loaded"] == before["loaded"] + len(parts)
    # queued again: in memory now, so nothing is queued and it is returned at once
    assert segment_kernel.compile_program(parts[0].prog, parts[0].geo, None, defer=True) is fns[0]


def test_a_worker_compiles_a_kernel_that_is_no_segments_and_the_caller_loads_it(workers):
    """The loss gradient's scaling (``scale_unless_one``), queued as a function and its arguments."""
    from thunder_fuser.backends.cute.families import scale_unless_one as scaling

    args = (torch.bfloat16, torch.float32, 8, "sm_90a")
    digest = cache.key_digest(scaling._cache_key(*args))
    def call():
        return scaling.__name__, "compile_into", args

    assert compile_workers.submit(digest, call, "sm_90a")
    compile_workers.wait(digest)
    before = dict(cache.stats)
    assert scaling.compile_into(*args) is not None
    assert cache.stats["compiled"] == before["compiled"]  # none compiled here
    assert cache.stats["loaded"] == before["loaded"] + 1
    assert not compile_workers.submit(digest, call, "sm_90a")  # in memory now: nothing to queue


def test_a_worker_imports_the_kernels_without_thunder():
    """A worker's imports are on the first kernel's path: thunder's (8 s on the H100's host)
    are not among them."""
    import subprocess

    probe = compile_workers._BOOTSTRAP.replace(
        "_serve(sys.argv[2])",
        "import thunder_fuser.ir.region, thunder_fuser.backends.cute.segment_kernel; print('thunder' in sys.modules)")
    out = subprocess.run(compile_workers.COMMAND[:2] + [probe] + compile_workers.COMMAND[3:] + ["sm_90a"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_dead_worker_leaves_its_kernels_to_the_caller(workers, monkeypatch):
    monkeypatch.setattr(compile_workers, "COMMAND", [sys.executable, "-c", "pass"])  # exits at once
    (part,) = _some_parts()[:1]
    assert segment_kernel.compile_program(part.prog, part.geo, None, defer=True) is None
    before = cache.stats["compiled"]
    assert segment_kernel.compile_program(part.prog, part.geo, None) is not None
    assert cache.stats["compiled"] == before + 1  # compiled here after all
    assert compile_workers._broken and "died" in compile_workers._broken[0]
    (other,) = _some_parts()[1:2]
    assert segment_kernel.compile_program(other.prog, other.geo, None, defer=True) is not None  # no more queueing


class _StandIn:
    """``compile_members`` for the plan's side on the CPU: ``defer`` queues (returns None);
    otherwise a launch function that runs the programs with torch. Counts both, and fails
    the programs of ``fail`` (a family name) when built."""

    def __init__(self, fail: str | None = None, seed: int | None = None):
        self.queued, self.launches, self.fail = 0, 0, fail
        self.some = None if seed is None else random.Random(seed)  # then queue only some (the rest: cached)

    def __call__(self, members, device, defer=False, directory=None):
        if defer and (self.some is None or self.some.random() < 0.5):
            self.queued += 1
            cache.stats["queued"] += 1  # as ``compile_workers.submit`` counts
            return None
        if self.fail and any(prog.family == self.fail for prog, _ in members):
            raise RuntimeError(f"{self.fail} kernel failed to build")

        def launch(views, *extra):
            self.launches += 1
            for (prog, geo), v in zip(members, views if len(members) > 1 else (views,)):
                run_program(prog, geo, v)

        return launch


@pytest.fixture
def stand_in(monkeypatch):
    from thunder_fuser.plan import decision

    monkeypatch.setattr(plan_mod, "kernel_mode", lambda env, region: "cute")
    monkeypatch.setattr(decision, "kernel_mode", lambda env, region: "cute")  # its stored views too
    monkeypatch.setattr(segment_kernel, "FILL_NAN", True)  # an unwritten element fails
    monkeypatch.setitem(cache.stats, "queued", cache.stats["queued"])  # restored after: the stand-in counts
    compiler = _StandIn()
    monkeypatch.setattr(segment_kernel, "compile_members", compiler)
    return compiler


def _runners(jfn) -> list:
    traces = [thunder.last_traces(jfn)[-1]] + thunder.last_backward_traces(jfn)[-1:]
    return [v for t in traces for v in t.python_ctx().values() if isinstance(v, RegionRunner)]


def test_the_first_call_runs_on_the_reference_backend_while_its_kernels_compile(stand_in):
    """RoPE's q and k share one launch: queued as one kernel, its members' own never built."""
    args = [torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(8, 16), torch.randn(8, 16)]
    jfn = thunder.jit(rope, executors=[fuser_ex])
    torch.testing.assert_close(jfn(*args), rope(*args))
    assert stand_in.launches == 0 and stand_in.queued == 1
    (runner,) = _runners(jfn)
    assert runner.fast is None  # written once the kernels are built
    for _ in range(2):
        args = [torch.randn_like(a) for a in args]
        torch.testing.assert_close(jfn(*args), rope(*args))
    assert stand_in.launches == 2 and stand_in.queued == 1
    assert runner.fast is not None
    assert "one launch with segment" in explain(jfn)


def _block_step(fn, block, x) -> list:
    """The output of ``fn(x)`` and the gradients of ``x`` and of ``block``'s parameters."""
    x.grad = None
    for p in block.parameters():
        p.grad = None
    y = fn(x)
    y.square().mean().backward()
    return [y, x.grad] + [p.grad for p in block.parameters()]


@pytest.mark.parametrize("some", [None, 0, 1], ids=["every kernel queued", "half queued", "another half"])
def test_a_training_step_matches_eager_from_its_first_call(stand_in, monkeypatch, some):
    """Forward and backward of a transformer block: the first call's segments run on the
    reference backend in the kernels' layouts, which later kernels of the same plans read
    (with some kernels built at once, as where the disk cache holds them)."""
    if some is not None:
        stand_in = _StandIn(seed=some)
        monkeypatch.setattr(segment_kernel, "compile_members", stand_in)
    torch.manual_seed(0)
    block = TransformerBlock(64, 4)
    x = torch.randn(2, 16, 64, requires_grad=True)
    jfn = thunder.jit(block, executors=[fuser_ex])
    for step in range(3):
        for g, w in zip(_block_step(jfn, block, x), _block_step(block, block, x)):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        if step == 0:
            assert stand_in.queued > 0 and (stand_in.launches == 0) == (some is None)
    assert stand_in.launches > 0
    assert all(r.fast is not None for r in _runners(jfn))


def test_a_segment_whose_reference_run_holds_much_memory_compiles_at_the_first_call(stand_in, monkeypatch):
    """A loss over a vocabulary: on the reference backend its fp32 upcast of the logits would
    be alive for the whole segment, so its kernels are built at once, not queued."""
    import torch.nn.functional as F

    def loss(x, t):
        return F.cross_entropy(x.float(), t)

    x, t = torch.randn(64, 512, dtype=torch.bfloat16), torch.randint(0, 512, (64,))
    monkeypatch.setattr(plan_mod, "REFERENCE_BYTES_TO_DEFER", 64 * 512 * 4 - 1)  # below the upcast logits
    jfn = thunder.jit(loss, executors=[fuser_ex])
    torch.testing.assert_close(jfn(x, t), loss(x, t))
    assert stand_in.launches > 0  # at the first call
    big = [s for p in plans(thunder.last_traces(jfn)[-1]) for s in p.decision.segments
           if plan_mod.reference_bytes(s) > plan_mod.REFERENCE_BYTES_TO_DEFER]
    assert big


def test_a_segment_within_the_gpus_reference_budget_runs_on_the_reference_backend_first(stand_in, monkeypatch):
    """The same loss where a sixteenth of the GPU's free memory holds its reference run
    (``plan.reference_budget``): queued for a worker like the rest, not compiled at once."""
    import torch.nn.functional as F

    def loss(x, t):
        return F.cross_entropy(x.float(), t)

    x, t = torch.randn(64, 512, dtype=torch.bfloat16), torch.randint(0, 512, (64,))
    monkeypatch.setattr(plan_mod, "REFERENCE_BYTES_TO_DEFER", 64 * 512 * 4 - 1)
    monkeypatch.setattr(plan_mod, "reference_budget", lambda device: 2**40)
    monkeypatch.setenv("THUNDER_FUSER_COMPILE_WORKERS", "2")  # there are workers to defer to (the stand-in's)
    jfn = thunder.jit(loss, executors=[fuser_ex])
    torch.testing.assert_close(jfn(x, t), loss(x, t))
    assert stand_in.launches == 0 and stand_in.queued > 0


def test_the_reference_budget_is_a_sixteenth_of_the_free_gpu_memory_at_least_256_mib(monkeypatch):
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (64 * 2**30, 80 * 2**30))
    assert plan_mod.reference_budget(gpu) == 4 * 2**30
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)  # not asked inside a capture
    assert plan_mod.reference_budget(gpu) == plan_mod.REFERENCE_BYTES_TO_DEFER
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 80 * 2**30))
    assert plan_mod.reference_budget(gpu) == plan_mod.REFERENCE_BYTES_TO_DEFER
    assert plan_mod.reference_budget(torch.device("cpu")) == plan_mod.REFERENCE_BYTES_TO_DEFER


def test_a_kernel_that_fails_to_build_in_a_later_call_falls_back_with_one_warning(monkeypatch, stand_in):
    compiler = _StandIn(fail="rows")
    monkeypatch.setattr(segment_kernel, "compile_members", compiler)
    backend.forget_warnings()

    def f(x, w):
        y = torch.nn.functional.gelu(x) * w
        return torch.softmax(y, -1) + 1, (y * 2).sum(0)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_vs_eager(f, torch.randn(16, 64), torch.randn(64))
        jfn, _ = check_vs_eager(f, torch.randn(16, 64), torch.randn(64))
    msgs = [str(w.message) for w in caught if issubclass(w.category, KernelFallbackWarning)]
    assert msgs and all("rows kernel failed to build" in m for m in msgs), msgs
    assert any(p.decision.fallbacks for p in plans(thunder.last_traces(jfn)[-1]))


@pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom")  # eager's too (a var over one element)
@settings(max_examples=60)
@given(programs(), st.integers(0, 2**16))
def test_random_programs_with_some_kernels_still_compiling_match_float64(program, seed):
    """Property: at a first call where some kernels are built (from the disk cache) and the
    others still compile, built kernels read what the reference backend ran in place of the
    others (their outputs in the kernels' layouts); both calls as near float64 as eager."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan_mod, "kernel_mode", lambda env, region: "cute")
        mp.setattr(segment_kernel, "FILL_NAN", True)
        mp.setattr(segment_kernel, "compile_members", _StandIn(seed=seed))
        mp.setitem(cache.stats, "queued", cache.stats["queued"])
        check_vs_float64(program.compile(), *program.make_arguments("cpu"))


@pytest.mark.cuda
def test_a_training_step_on_the_gpu_with_kernels_from_worker_processes(monkeypatch, tmp_path):
    """Real kernels: the first step on the reference backend while two workers compile them
    for this GPU, the next ones on the kernels loaded from the disk cache (none compiled in
    this process), every step against eager."""
    monkeypatch.setenv("THUNDER_FUSER_COMPILE_WORKERS", "2")
    monkeypatch.setenv("THUNDER_FUSER_CACHE", str(tmp_path))
    monkeypatch.setattr(segment_kernel, "FILL_NAN", True)
    cache.clear_memory()
    try:
        torch.manual_seed(0)
        block = TransformerBlock(256, 4).cuda()
        x = torch.randn(2, 64, 256, device="cuda", requires_grad=True)
        jfn = thunder.jit(block, executors=[fuser_ex])
        before = dict(cache.stats)
        for _ in range(3):
            for g, w in zip(_block_step(jfn, block, x), _block_step(block, block, x)):
                torch.testing.assert_close(g, w, atol=2e-4, rtol=2e-4)
        assert cache.stats["queued"] > before["queued"]
        assert cache.stats["compiled"] == before["compiled"]
        assert cache.stats["loaded"] >= before["loaded"] + cache.stats["queued"] - before["queued"]
        assert all(r.fast is not None for r in _runners(jfn))
    finally:
        compile_workers.shutdown()
        cache.clear_memory()


def test_a_graph_is_captured_only_after_a_call_that_queued_nothing(stand_in):
    """``graphed`` with one warm-up call: that call queues the kernels (its plans run on the
    reference backend), so the next runs as it is too, building them; only the third
    captures, recording kernels, never the reference backend."""
    from test_decode import _decode_step
    from test_graphs import RecordingGraphs, _weights

    import thunder_fuser
    from thunder_fuser.cudagraphs.graphs import graphed

    def step(*args):  # a kernel after attention (the cache writes are torch's, the rest views)
        return torch.tanh(_decode_step(*args))

    ws = _weights()
    g = graphed(thunder.jit(step, executors=thunder_fuser.executors()), warmup=1, backend=RecordingGraphs())
    ours, theirs = [torch.zeros(1, 4, 16, 16) for _ in range(2)], [torch.zeros(1, 4, 16, 16) for _ in range(2)]
    seen = []
    for pos in range(5):
        x, at = torch.randn(1, 1, 64), torch.tensor([pos])
        torch.testing.assert_close(g(x, *ours, at, *ws), step(x, *theirs, at, *ws))
        for c, w in zip(ours, theirs):
            torch.testing.assert_close(c, w)
        seen.append((g.queued_last, g.captures, stand_in.launches > 0))
    assert seen[:3] == [(True, 0, False), (False, 0, True), (False, 1, True)], seen


def test_nothing_is_queued_while_paused(monkeypatch):
    """(a CUDA graph's capture: ``cudagraphs/graphs.py``)"""
    monkeypatch.setenv("THUNDER_FUSER_COMPILE_WORKERS", "3")
    with compile_workers.paused():
        assert compile_workers.count() == 0
        assert not compile_workers.submit("a digest", [], "sm_90a")
    assert compile_workers.count() == 3


def test_workers_start_with_the_executors_on_a_cuda_machine(monkeypatch):
    """``thunder_fuser.executors()`` starts the workers where CUDA kernels will be built, so
    their imports overlap thunder's tracing of the first call; elsewhere it starts nothing."""
    import thunder_fuser
    from thunder_fuser.backends.cute import backend

    started = []
    monkeypatch.setattr(compile_workers, "start", started.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    thunder_fuser.executors()
    assert started == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(backend, "cute_on", lambda device_type: device_type == "cuda")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    thunder_fuser.executors()
    assert started == ["sm_90a"]
