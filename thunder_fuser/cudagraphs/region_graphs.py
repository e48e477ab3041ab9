"""A region call's kernel launches replayed as one CUDA graph, keyed on their pointers.

A training step of a small model is bound by the host: pythia-410m's 19 region calls
cost about 0.70 ms of a 3.3 ms step on the H100 host, and their 31 CuTe DSL launches
(TVM-FFI, 8.6 us each in place) are the largest part (``scripts/region_host_probe.py``).
A graph replays them in one driver call. It stays correct without any static buffer
because it is keyed on every pointer its launches read or write: the generated code
(``straight_line.py``) allocates as before, then looks up the tuple of the data pointers
of every tensor its launches touch. A steady step allocates the same sizes in the same
order, so the caching allocator hands out the same addresses and the key repeats (H100,
pythia: one key per region over 20 steps, every call a replay after the second); any
other key launches as before. Nothing else a launch depends on can change between calls
of one generated function: shapes, strides and dtypes are its plan's key, a kernel takes
no number known only at run time (``backends/cute/lower/expr.py`` refuses one), and the alignment
guards run before the key is built.

A key is captured once it has been seen ``CAPTURE_AT`` times (a capture costs the
launches and a graph instantiation). A region keeps ``MAX_GRAPHS`` graphs, a new one
replacing the oldest: after anything else allocated between two steps (an evaluation, a
checkpoint, another model), the same step lands at other addresses and settles there in
a step or two. A region whose keys never settle (``MAX_WASTED`` graphs replaced before
they replayed ``USEFUL`` times) stops capturing; graphs that served and were replaced
(a training loop with an evaluation every so many steps) do not count. A capture records
without running, so the launches it records are replayed at once; a capture that fails
runs the launches plainly and that key is not tried again.
Captures use ``CUDAGraph.capture_begin`` on a side stream, without the device sync,
garbage collection and ``empty_cache`` of ``torch.cuda.graph``: emptying the cache would
move every later allocation and so every key. The launches allocate nothing themselves
(a column reduction's workspace is allocated before them, with the region's outputs), so
a capture holds no memory.

What it buys is small (H100, 2 x 1024 tokens, x torch.compile's step): in one probe,
pythia-410m 0.89 -> 0.97 synced each step and 0.94 -> 1.00 pipelined, Qwen2 1.04 -> 1.05
and 0.82 -> 0.91; in the model benchmark beside a contender launching plainly, pythia 1.21
-> 1.15 and Qwen2 1.04 -> 1.07 (``benchmarks/results/region_graphs``). A replay's
``cudaGraphLaunch`` costs the driver more than one kernel launch, so the saving is the
launches' Python, TVM-FFI and views, not the launches themselves.

Inside a whole-step capture (``graphs.graphed``), or any graph being captured on the
current stream (thunder's ``CUDAGraphTransform``), a region launches plainly: its launches
become part of that graph. ``THUNDER_FUSER_REGION_GRAPHS=0`` turns this off (the code is
then written as before). Off a GPU the tests use ``StandIn``: it "replays" by launching
the current call's closure after checking that every tensor it reads has a pointer in the
key, which is what keeps a real replay correct.
"""

from __future__ import annotations

import weakref

import torch
from thunder_fuser import config

# a region with fewer launches keeps its plain code (2 was no better on the H100: pythia
# 0.96 / 0.97, Qwen2 1.07 / 0.96 against 1 above)
MIN_LAUNCHES = 1
CAPTURE_AT = 2  # sightings of one key before it is captured
MAX_GRAPHS = 8  # graphs kept per generated function: a new one replaces the oldest
USEFUL = 2  # replays after its capture that make a replaced graph worth its capture
MAX_WASTED = 16  # graphs replaced before they were useful, per generated function, before it stops capturing
MAX_SIGHTED = 64  # keys counted per generated function before the count starts anew
RETIRED_MAX = 256  # graphs replaced on a cuBLAS stream kept alive before all of its graphs go at once

# "sighted": a key seen before its capture (a step that sights or captures none is steady)
stats = {"captures": 0, "replays": 0, "failed": 0, "sighted": 0}
_suspended = [0]  # > 0 inside a capture: a whole-step one (``cudagraphs/graphs.py``), or a launch run's
_off = [0]  # > 0 inside ``turned_off``


def wanted(device) -> bool:
    """Write region code with a graph: on a CUDA device unless turned off, and in the tests'
    stand-in mode."""
    if not config.flag("THUNDER_FUSER_REGION_GRAPHS") or _off[0]:
        return False
    if STAND_IN:
        return True
    return getattr(device, "type", None) == "cuda"


STAND_IN = False  # tests set it: region graphs on the CPU, replayed by ``StandIn``


class turned_off:
    """Region code written inside this block launches plainly (a benchmark's contender
    without region graphs beside one with them, in one process)."""

    def __enter__(self):
        _off[0] += 1

    def __exit__(self, *exc):
        _off[0] -= 1


class suspended:
    """Regions launch plainly inside this block: a graph is being captured that takes their
    launches (a whole step's, or a launch run's, whose members' own graphs must not join it)."""

    def __enter__(self):
        _suspended[0] += 1

    def __exit__(self, *exc):
        _suspended[0] -= 1


class RegionGraphs:
    """The graphs of one generated function: ``self(key, launches)`` replays the graph of
    ``key`` or runs ``launches()`` (capturing it once the key has been seen often enough)."""

    def __init__(self, name: str, backend=None, matmuls: bool = False):
        """``matmuls``: the launches call cuBLAS (a launch run's), so their graphs capture
        on ``MatmulCapture``'s stream and retire rather than die one by one."""
        self.name = name
        self.backend = backend or (StandIn() if STAND_IN else MatmulCapture() if matmuls else CudaCapture())
        self.graphs: dict = {}
        self.sighted: dict = {}
        self.refused: set = set()
        self.wasted = 0  # graphs replaced before they were useful
        self.retirement = getattr(self.backend, "retirement", None)
        if self.retirement is not None:
            self.retirement.adopt(self)

    def __call__(self, key: tuple, launches) -> None:
        g = self.graphs.get(key)  # [replay, replays since the capture]
        if g is not None and not _suspended[0]:
            try:
                g[0](launches)
            except RuntimeError:
                if not self.backend.capturing():
                    raise
                launches()  # inside a graph someone else captures (torch refuses a replay there)
                return
            g[1] += 1
            stats["replays"] += 1
            return
        self.miss(key, launches)

    def miss(self, key: tuple, launches) -> None:
        if _suspended[0] or key in self.refused or self.wasted >= MAX_WASTED or self.backend.capturing():
            launches()
            return
        seen = self.sighted.get(key, 0) + 1
        if seen < CAPTURE_AT:
            if len(self.sighted) >= MAX_SIGHTED:
                self.sighted.clear()
            self.sighted[key] = seen
            stats["sighted"] += 1
            launches()
            return
        self.sighted.pop(key, None)
        if len(self.graphs) >= MAX_GRAPHS:  # before the capture: a retirement may end every graph
            oldest = self.graphs.pop(next(iter(self.graphs)))
            self.wasted += oldest[1] < USEFUL
            if self.retirement is not None:
                self.retirement.retire(oldest[0])
        try:
            with suspended():  # a launch run's members launch into it, not through their own graphs
                g = self.backend.capture(launches, key)
        except Exception:  # noqa: BLE001 - a region that cannot be captured launches as before
            stats["failed"] += 1
            self.refused.add(key)
            launches()
            return
        stats["captures"] += 1
        self.graphs[key] = [g, 0]
        g(launches)
        stats["replays"] += 1


class CudaCapture:
    """Captures ``launches()`` on the side stream every plain region's capture shares, into a
    graph of its own; TVM-FFI's launch stream (our kernels') follows torch's there. Plain
    regions launch CuTe DSL kernels only, so their stream never gets a cuBLAS workspace and
    their graphs may die one by one. Each graph keeps a pool of its own: a pool shared by
    graphs freed in between (one model's, then the next model's) fails torch 2.11's host
    allocator (``it->second->use_count > 0`` at ``capture_begin``), and our captures
    allocate nothing else."""

    streams: dict = {}  # device index -> this kind's capture stream there

    @staticmethod
    def capturing() -> bool:
        """Is a graph being captured on this stream (thunder's ``CUDAGraphTransform``, a
        caller's ``torch.cuda.graph``)? The launches then belong in that graph: a capture of
        our own would join its side stream to it."""
        return torch.cuda.is_current_stream_capturing()

    def capture(self, launches, key):
        import tvm_ffi

        streams = type(self).streams
        device = torch.cuda.current_device()
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = torch.cuda.Stream(device)
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        try:
            with tvm_ffi.use_torch_stream(torch.cuda.stream(stream)):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    launches()
                finally:
                    graph.capture_end()  # raises if the capture was invalidated
        except BaseException:
            self.failed(graph)
            raise
        current.wait_stream(stream)
        replay = graph.replay

        def run(_launches):
            replay()

        run.graph = graph  # the graph lives as long as its replay
        return run

    def failed(self, graph) -> None:
        """A graph whose capture failed: let it go."""


class Retirement:
    """Graphs that share one stream's cuBLAS workspace, destroyed only all together.

    A graph that calls cuBLAS keeps the address of its stream's workspace, which cuBLAS
    allocates at the stream's first matmul (32 MiB on the H100) and torch caches per stream.
    torch's ``CUDAGraph.reset`` (also its destructor) drops the workspaces cached for the
    stream it captured on (pytorch#175276, ``clearCublasWorkspacesForStream``), though other
    live graphs captured there still use them: freed, and once the pool that holds it is
    released, handed to other tensors, which those graphs' replays then overwrite (the
    crash of pytorch#193402). So a replaced graph is kept here (a launch run's graph holds
    no memory of its own: its outputs are allocated before its capture), and the
    retirement that brings the count to ``RETIRED_MAX`` (made before a capture) ends every
    graph of the stream at once: the workspace is then nobody's, and the next capture
    allocates another. A region whose graphs die with their model retires them too (a
    finalizer, which ends nothing: they count at the next retirement), since another
    model's may live on."""

    def __init__(self):
        self.retired: list = []
        self.owners = weakref.WeakSet()

    def adopt(self, owner: RegionGraphs) -> None:
        self.owners.add(owner)
        weakref.finalize(owner, _retire_all, self.retired, owner.graphs)

    def retire(self, graph) -> None:
        """Keep ``graph``; with ``RETIRED_MAX`` kept, end every graph of the stream. Called
        before a capture or after a failed one, never while a new graph waits to join its
        region's."""
        self.retired.append(graph)
        if len(self.retired) < RETIRED_MAX:
            return
        for owner in list(self.owners):
            owner.graphs.clear()
        self.retired.clear()


def _retire_all(retired: list, graphs: dict) -> None:
    retired.extend(g[0] for g in graphs.values())
    graphs.clear()


class MatmulCapture(CudaCapture):
    """``CudaCapture`` on a stream of its own for launches that call cuBLAS (a launch run's
    matmuls, ``launch_run.py``): one stream, so one workspace for all of them (on a stream
    per run, pythia-410m kept 14 of 32 MiB each on the H100, and its steps ran 1.4x slower);
    not the plain regions' stream, so that their graphs die freely; its graphs retire
    (``Retirement``)."""

    streams: dict = {}
    retirement = Retirement()

    def failed(self, graph) -> None:
        """A failed capture may have met the workspace too: it retires as well."""
        self.retirement.retire(graph)


class StandIn:
    """The tests' graph: checks that every tensor the launches read lies at a pointer of the
    key (a real replay would read whatever lies at the captured pointers), then launches,
    suspended as a capture is (a real replay calls nothing: no graph nested in the launches,
    a launch run member's own, is seen)."""

    @staticmethod
    def capturing() -> bool:
        return False

    def capture(self, launches, key):
        self.check(launches, key)

        def run(now):
            self.check(now, key)
            with suspended():
                now()

        return run

    @staticmethod
    def check(launches, key) -> None:
        ptrs = set(_ints(key))
        for launch in getattr(launches, "parts", (launches,)):  # a launch run's (``launch_run.py``)
            for cell in launch.__closure__ or ():
                t = cell.cell_contents
                if isinstance(t, torch.Tensor) and t.data_ptr() not in ptrs:
                    raise AssertionError(f"a launch reads a tensor at {t.data_ptr():#x}, not among the key's pointers")


def _ints(key):
    for k in key:
        if isinstance(k, tuple):
            yield from _ints(k)
        else:
            yield k
