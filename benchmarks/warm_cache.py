"""A second process over the kernel cache the suite filled: how long until the first launch.

Run by ``benchmarks.run`` after the suite with the same ``THUNDER_FUSER_CACHE``; prints one
JSON line: per workload the first-call wall time (thunder's tracing included) and the
time spent loading kernels from disk, per kernel; and, once, the import of the CuTe DSL and
TVM-FFI packages that precedes the first kernel (``_library_import_s``).
"""

from __future__ import annotations

import json
import time

import torch

import thunder_fuser  # noqa: F401
import thunder

from benchmarks.suite import cases
from thunder_fuser import fuser_ex
from thunder_fuser.backends.cute import backend, cache


def main(argv=None) -> None:
    from benchmarks import cli

    cli.parser("benchmarks.warm_cache", __doc__).parse_args(argv)
    cli.require_cuda("benchmarks.warm_cache")
    t0 = time.perf_counter()
    backend.cute_available()  # the process's one-time import of CuTe DSL and TVM-FFI
    out = {"_library_import_s": time.perf_counter() - t0}
    for case in cases():
        if case.kind != "large" or case.backward:
            continue
        args = case.make()
        before = dict(cache.stats)
        t0 = time.perf_counter()
        thunder.jit(case.fn, executors=[fuser_ex])(*args)
        torch.cuda.synchronize()
        loaded = cache.stats["loaded"] - before["loaded"]
        out[case.name] = {
            "first_call_s": time.perf_counter() - t0,
            "kernels_loaded": loaded,
            "kernels_compiled": cache.stats["compiled"] - before["compiled"],
            "load_ms_per_kernel": 1e3 * (cache.stats["load_s"] - before["load_s"]) / max(loaded, 1),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
