"""thunder's cache of traces, bounded.

thunder 0.2.6 keeps every trace a ``thunder.jit`` function makes (``CompileStats.interpreter_cache``,
one per input shape, dtype, grad mode and more) and, at each call, tries the prologues of
all of them, newest first. A process that meets many shapes (an evaluation of variable
lengths) keeps them all: 200 lengths kept 210 traces, 114 MiB on the CPU, with every
region's plans and kernels behind them. thunder has no setting that bounds it
(``cache="no caching"`` retraces every call). Here the list is one that drops its oldest
entry beyond ``THUNDER_FUSER_MAX_TRACES`` (default 256; ``0``: no bound) when thunder adds
one; a dropped shape is traced again if it comes back."""

from __future__ import annotations

from thunder_fuser import config
from thunder_fuser.patches.wrap import wrap_once


class BoundedTraceCache(list):
    """thunder's list of cache entries, oldest first, that drops the oldest beyond the bound."""

    def append(self, entry) -> None:
        super().append(entry)
        bound = config.integer("THUNDER_FUSER_MAX_TRACES")
        if bound is not None and bound > 0 and len(self) > bound:
            del self[: len(self) - bound]


def bound_thunders_trace_cache() -> bool:
    """Make each new ``CompileStats`` hold a ``BoundedTraceCache``; False where thunder is not
    as expected."""
    try:
        from thunder.common import CompileStats
    except ImportError:
        return False

    def wrap(init):
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            if type(getattr(self, "interpreter_cache", None)) is list:
                self.interpreter_cache = BoundedTraceCache(self.interpreter_cache)

        return __init__

    return wrap_once(CompileStats, "__init__", wrap)
