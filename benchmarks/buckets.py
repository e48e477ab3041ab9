"""Bucketed sequence lengths: a contender's steps over several lengths in turns, against the
same steps at one fixed length, and whether anything was built again after each length's
first step.

A training loop that buckets its batches by length (or packs them to a few lengths) hands
the model a handful of shapes in turns. Every compiler builds something per shape on its
first sight (thunder a trace, torch.compile a graph, we a plan and kernels); after that a
step at a length seen before must cost what it costs in a run at that length alone:
nothing traced, planned or compiled again, and no CUDA graph recaptured for good.

``bucketed`` reports per length: the first step's seconds, the median step at the fixed
length (``fixed_ms``) and in turns (``turns_ms``), and their ratio; and ``rebuilt``, what
the turns built after every length's first step: thunder's cache misses, Dynamo's graphs,
our kernels compiled or loaded, our regions' plans. All must be zero.
"""

from __future__ import annotations

import statistics
import time

import torch

FIXED_STEPS = 5  # steps at each length alone, after its first
ROUNDS = 4  # turns over the lengths, a step each


def built_so_far(fn) -> dict:
    """Counters of what has been built: thunder's cache misses for ``fn`` (where thunder
    compiled it), Dynamo's unique graphs, our kernels compiled or loaded and our plans."""
    import thunder

    from thunder_fuser.backends.cute import cache

    counts = {"dynamo_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
              "kernels": cache.stats["compiled"] + cache.stats["loaded"], "plans": _plans()}
    try:
        counts["thunder_cache_misses"] = thunder.compile_stats(fn).cache_misses
    except Exception:  # noqa: BLE001 - not a thunder function (eager, torch.compile)
        counts["thunder_cache_misses"] = 0
    return counts


def _plans() -> int:
    """Plans built by every live region runner of the process."""
    import gc

    from thunder_fuser.runtime.region_runner import RegionRunner

    # type(), not isinstance: isinstance asks a dead weak proxy among the objects and raises
    return sum(len(o.plans) for o in gc.get_objects() if issubclass(type(o), RegionRunner))


def bucketed(time_steps, fn, batches: dict, fixed_steps: int = FIXED_STEPS, rounds: int = ROUNDS) -> dict:
    """Steps over ``batches`` (length -> batch), timed by ``time_steps(idx, targets, n)``
    (milliseconds per step, ``zoo.Trainer.time_steps``): each length's first step and its
    steps alone, then ``rounds`` turns over the lengths; ``fn``: what ``built_so_far``
    asks thunder about."""
    out: dict = {"lengths": {}}
    for length, b in batches.items():
        t0 = time.perf_counter()
        time_steps(*b, 1)
        first_s = time.perf_counter() - t0
        fixed = time_steps(*b, fixed_steps)
        out["lengths"][str(length)] = {"first_s": round(first_s, 2), "fixed_ms": round(statistics.median(fixed), 3)}
    before = built_so_far(fn)
    turns: dict = {length: [] for length in batches}
    for _ in range(rounds):
        for length, b in batches.items():
            turns[length] += time_steps(*b, 1)
    after = built_so_far(fn)
    for length, ts in turns.items():
        row = out["lengths"][str(length)]
        row["turns_ms"] = round(statistics.median(ts), 3)
        row["x_fixed"] = round(row["turns_ms"] / row["fixed_ms"], 3)
    out["rebuilt"] = {k: after[k] - before[k] for k in after}
    out["worst_x_fixed"] = max(r["x_fixed"] for r in out["lengths"].values())
    return out
