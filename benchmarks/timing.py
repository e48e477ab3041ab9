"""How the harness times a contender: device time from CUDA-graph replays, host overhead
from the wall clock.

* ``device_ms``: the call is captured once in a CUDA graph (each of several input sets, so
  inputs that fit in L2 rotate) and the graph is replayed between CUDA events; the median
  over at least 50 replays is the time the GPU spends, free of Python and launch gaps. A
  call that cannot be captured (a host sync inside) is timed with events around each call
  instead, and the result says so (``graph: False``): that number includes host time
  whenever the host is slower than the GPU.
* ``host_us``: the wall clock of many back-to-back calls on small inputs, divided by their
  number: what a user pays per call when kernels are tiny.
"""

from __future__ import annotations

import statistics
import time

import torch


def _events_ms(run, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return out


def device_ms(fn, arg_sets: list[tuple], reps: int = 50, warmup: int = 3) -> tuple[float, bool]:
    """Median milliseconds of one call of ``fn`` on the GPU, and whether a graph was used."""
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
        return statistics.median(_events_ms(replay, reps)), True
    except Exception:  # noqa: BLE001 - not capturable: plain events
        torch.cuda.synchronize()
        i = [0]

        def call():
            fn(*arg_sets[i[0] % len(arg_sets)])
            i[0] += 1

        return statistics.median(_events_ms(call, reps)), False


def host_us(fn, args: tuple, calls: int = 200) -> float:
    """Wall-clock microseconds per call over back-to-back calls (small inputs)."""
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best
