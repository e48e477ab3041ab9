"""How the harness times a contender: device time from CUDA-graph replays, host overhead
from the wall clock.

* ``device_ms``: the call is captured once in a CUDA graph (each of several input sets, so
  inputs that fit in L2 rotate) and the graph is replayed between CUDA events, replays
  queued back to back as a training step queues its kernels; the median over at least 50
  replays is the time the GPU spends, free of Python and launch gaps. (Until session 12 the
  host waited for each replay before it issued the next: each then began on an idle GPU,
  and the graph launch's latency, 1-4 us, was counted in. That cost a 35 us workload such
  as RoPE Mistral-7B 5-7% (0-11% by placement) and a 180 us copy under 1%: ``scripts/timing_probe.py``.) A
  call that cannot be captured (a host sync inside) is timed with events around each call
  instead, and the result says so (``graph: False``): that number includes host time
  whenever the host is slower than the GPU.
* ``host_us``: the wall clock of many back-to-back calls on small inputs, divided by their
  number: what a user pays per call when kernels are tiny. ``host_us_interleaved`` times
  several callables in turns, so that a host which slows down for a while (the H100 host's
  per-call numbers moved by half between runs) slows every row alike.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch


def _events_ms(run, reps: int, queued: bool) -> list[float]:
    """Milliseconds between an event before and one after each of ``reps`` calls of ``run``.

    ``queued``: the host does not wait for one call before it issues the next, so while the
    GPU works on one the next is already queued behind it and its start event is stamped as
    the previous call ends. Waiting instead leaves the GPU idle at each start event until the
    host's launch of the work arrives, and that launch latency (microseconds) is counted."""
    pairs = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        if not queued:
            e.synchronize()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in pairs]


def device_ms(fn, arg_sets: list[tuple], reps: int = 50, warmup: int = 3, queued: bool = True) -> tuple[float, bool]:
    """Median milliseconds of one call of ``fn`` on the GPU, and whether a graph was used.
    ``queued``: graph replays are issued back to back (see ``_events_ms``)."""
    for _ in range(warmup):
        for a in arg_sets:
            fn(*a)
    torch.cuda.synchronize()
    try:
        graphs = []
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for a in arg_sets:  # one more warm call on the capture stream
                fn(*a)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for a in arg_sets:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn(*a)
            graphs.append(g)
        torch.cuda.synchronize()
        i = [0]

        def replay():
            graphs[i[0] % len(graphs)].replay()
            i[0] += 1

        for _ in range(3):
            replay()
        return statistics.median(_events_ms(replay, reps, queued)), True
    except Exception:  # noqa: BLE001 - not capturable: plain events
        torch.cuda.synchronize()
        i = [0]

        def call():
            fn(*arg_sets[i[0] % len(arg_sets)])
            i[0] += 1

        return statistics.median(_events_ms(call, reps, queued=False)), False


def host_us(fn, args: tuple, calls: int = 200) -> float:
    """Wall-clock microseconds per call over back-to-back calls (small inputs)."""
    return host_us_interleaved({"": functools.partial(fn, *args)}, calls, rounds=3)[""][0]


def host_us_interleaved(fns: dict, calls: int = 500, rounds: int = 15, issue_only: bool = False) -> dict:
    """name -> (least, median) microseconds per call of each of ``fns``, over ``rounds``
    turns of ``calls`` back-to-back calls each, the callables taking turns. The least is
    the cost itself (the host only ever adds to it); the median says how steady it was.
    ``issue_only``: the time to issue the calls, the GPU's wait for them left out (a
    launch whose kernel outlasts it: its host cost, not its kernel's)."""
    for fn in fns.values():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    runs = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            issued = time.perf_counter()
            torch.cuda.synchronize()
            runs[name].append(((issued if issue_only else time.perf_counter()) - t0) / calls * 1e6)
    return {name: (min(us), statistics.median(us)) for name, us in runs.items()}
