"""Compiled kernels, cached in process and on disk.

The key is (program text, geometry signature, GPU arch): dtypes, which strides are 0 or 1,
vector width and row tiling are in the signature; extents and other strides are symbolic,
so one kernel serves every size that shares them.

On disk, a kernel is the object file ``export_to_c`` writes, loaded back with
``cute.runtime.load_module`` (no compiler run). The directory name fingerprints our
package, cutlass and Python, so an upgrade never loads a stale kernel. Two processes may
compile the same kernel at once: each writes a private temporary file and renames it into
place, which is atomic, so a reader sees a whole file or none.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
import os
import sys
import tempfile
import time
from pathlib import Path

from thunder_fuser.backends.cute import progress
from thunder_fuser import config

# digest -> loaded kernel, least recently used first: at most THUNDER_FUSER_MAX_KERNELS (a
# process that meets many shapes or programs must not grow without bound; the disk keeps all)
_memory: OrderedDict[str, object] = OrderedDict()
_compiled: dict[int, object] = {}  # id of a function in _memory -> what cute.compile returned (its PTX)
stats = {"compiled": 0, "loaded": 0, "hits": 0, "compile_s": 0.0, "load_s": 0.0, "queued": 0}


def fingerprint() -> str:
    """The disk cache's folder name: the kernel generator's sources (every file of this
    backend, its subfolders included), CuTe DSL's version and Python's."""
    import cutlass

    here = Path(__file__).parent
    h = hashlib.sha256()
    for f in sorted(here.rglob("*.py")):
        h.update(str(f.relative_to(here)).encode())
        h.update(f.read_bytes())
    h.update(getattr(cutlass, "__version__", "?").encode())
    h.update(sys.version.encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    root = config.raw("THUNDER_FUSER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "thunder_fuser")
    return Path(root) / fingerprint()


def key_digest(key) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()[:32]


def disk_cache_on() -> bool:
    return config.flag("THUNDER_FUSER_DISK_CACHE")


def cached(digest: str) -> bool:
    """Is the kernel of this key digest in memory, or on disk where the disk cache is on?"""
    return digest in _memory or (disk_cache_on() and (cache_dir() / f"tf_{digest}.o").exists())


def get_or_compile(key, build, directory: Path | None = None, digest: str | None = None):
    """The callable for ``key``: from memory, from disk, or ``build()`` (which returns a
    compiled TVM-FFI function) then exported to disk (``directory``: a worker writes where
    the process that queued the kernel reads, ``compile_workers.py``; ``digest``: the key's,
    where the caller has it)."""
    digest = digest or key_digest(key)
    fn = _memory.get(digest)
    if fn is not None:
        stats["hits"] += 1
        _memory.move_to_end(digest)
        return fn
    name = f"tf_{digest}"
    path = Path(directory or cache_dir()) / f"{name}.o"
    if path.exists() and disk_cache_on():
        t0 = time.perf_counter()
        try:
            from cutlass import cute

            fn = getattr(cute.runtime.load_module(str(path), enable_tvm_ffi=True), name)
            stats["loaded"] += 1
            stats["load_s"] += time.perf_counter() - t0
            if stats["queued"]:  # a worker's kernel arriving (``compile_workers.py``)
                progress.report(stats)
        except Exception:  # a truncated or foreign file: compile afresh
            fn = None
    if fn is None:
        t0 = time.perf_counter()
        compiled = build()
        stats["compiled"] += 1
        stats["compile_s"] += time.perf_counter() - t0
        progress.report(stats, str(key[1][0]) if isinstance(key, tuple) and len(key) > 1 else "")
        _export(compiled, path, name)
        fn = direct_function(compiled)
        _compiled[id(fn)] = compiled
    _memory[digest] = fn
    bound = config.integer("THUNDER_FUSER_MAX_KERNELS")
    while bound is not None and bound > 0 and len(_memory) > bound:
        _, old = _memory.popitem(last=False)
        _compiled.pop(id(old), None)
    return fn


def direct_function(compiled):
    """The TVM-FFI function inside what ``cute.compile`` returns, so that a launch goes
    straight to C, as a kernel loaded from disk does.

    CuTe DSL wraps its compiled function in a Python ``__call__`` (for keyword and pointer
    arguments) and that in a generated keyword wrapper: two Python frames per launch, which
    the process that compiled a kernel paid on every call and a process loading it from disk
    did not. We pass neither keywords nor pointers, so the wrappers have nothing to do.
    Where the compiled object holds no TVM-FFI function (compiled for another GPU than this
    process runs on: CI's PTX) or takes pointer arguments, it is kept as it is."""
    get = getattr(compiled, "__tvm_ffi_object__", None)
    args = getattr(compiled, "execution_args", None)
    if get is None or getattr(args, "has_pointer_address_arg_specs", True):
        return compiled
    return get() or compiled


def compiled_object(fn):
    """What ``cute.compile`` returned for ``fn`` (its ``artifacts.PTX``), where this process
    compiled it."""
    return _compiled[id(fn)]


def _export(compiled, path: Path, name: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".o", dir=path.parent)
        os.close(fd)
        compiled.export_to_c(tmp, function_name=name)
        os.replace(tmp, path)
    except Exception:  # a read-only home must not stop the kernel from running
        try:
            os.unlink(tmp)
        except Exception:
            pass


def clear_memory() -> None:
    _memory.clear()
    _compiled.clear()
