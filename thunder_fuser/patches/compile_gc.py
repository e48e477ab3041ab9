"""Python's garbage collector held back while thunder compiles a function.

A first call's tracing and transforms allocate several hundred thousand container objects
(the interpreter's wrapped values and provenance records, proxies, bound symbols, traces),
and each region's first call as many again (its plan: layouts, segments, kernel
geometries). CPython collects its youngest generation every 700 allocations net of frees,
the middle one every tenth of those, and the whole heap (torch, thunder, the model's
modules: a few million objects) when enough has survived: on the CPU machine,
transformers' Llama's tiny first step ran 505 young, 46 middle and 2 full collections,
0.5 s of its 3.9 s. Almost nothing they free is garbage: what a compile allocates is alive
in its traces and plans until it ends.

While thunder compiles (from ``thunder_general_jit``, which acquires the trace, to the
``CacheEntry`` that holds the compiled functions) and while a region's first calls build
its plan (``held``, in ``RegionRunner.general``), the youngest generation's threshold is
raised to ``COMPILE_THRESHOLD``: collections still run, about one per 100,000
allocations, and their garbage is collected as before. The thresholds are restored when
the cache entry is built, or at once where tracing raises (where a transform raises after
it, they stay raised until the next compile ends: still collecting, only less often).
``THUNDER_FUSER_COMPILE_GC=0`` leaves the collector alone. The hooks on thunder are
installed, like ``patches/interpreter_speedups.py``'s, only on the thunder whose code this was
read from (0.2.6).
"""

from __future__ import annotations

import functools
import gc

from thunder_fuser._compat import thunder_0_2_6
from thunder_fuser import config

COMPILE_THRESHOLD = 100_000

_saved: list = []  # the thresholds to restore, while a compile runs (nested compiles: the outermost's)
_ON = config.flag("THUNDER_FUSER_COMPILE_GC")


def _hold() -> None:
    if not _saved:
        t = gc.get_threshold()
        _saved.append(t)
        gc.set_threshold(max(t[0], COMPILE_THRESHOLD), *t[1:])


def _release() -> None:
    if _saved:
        gc.set_threshold(*_saved.pop())


class held:
    """A block that holds the collector back as a compile does (nothing where one is
    already held, or where switched off)."""

    __slots__ = ("mine",)

    def __enter__(self):
        self.mine = not _saved and _ON
        if self.mine:
            _hold()

    def __exit__(self, *exc):
        if self.mine:
            _release()


def _held_while_tracing(trace):
    @functools.wraps(trace)
    def thunder_general_jit(*args, **kwargs):
        _hold()
        try:
            return trace(*args, **kwargs)
        except BaseException:
            _release()
            raise

    thunder_general_jit.thunder_fuser_original = trace
    return thunder_general_jit


def _released_with(entry_type):
    class CacheEntry(entry_type):
        """thunder's cache entry; building one ends a compile (``compile_gc``)."""

        __slots__ = ()

        def __new__(cls, *args, **kwargs):
            _release()
            return super().__new__(cls, *args, **kwargs)

    CacheEntry.thunder_fuser_original = entry_type
    return CacheEntry


def hold_gc_while_compiling() -> bool:
    """Install the two hooks on thunder's ``jit``; False where switched off or where this
    thunder is not the one they were read from (nothing is changed then)."""
    thunder = thunder_0_2_6("THUNDER_FUSER_COMPILE_GC")
    if thunder is None:
        return False
    trace, entry = getattr(thunder, "thunder_general_jit", None), getattr(thunder, "CacheEntry", None)
    if hasattr(trace, "thunder_fuser_original"):
        return True
    if trace is None or entry is None or not (isinstance(entry, type) and issubclass(entry, tuple)):
        return False
    thunder.thunder_general_jit = _held_while_tracing(trace)
    thunder.CacheEntry = _released_with(entry)
    return True
