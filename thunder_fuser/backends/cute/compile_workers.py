"""Kernels compiled side by side in worker processes, while a plan's first call runs on the
reference backend.

A model's first step compiles 20-40 kernels at 0.2-0.8 s each, one after another: about
15 s of a 30 s first call of a litgpt step on the H100. CuTe DSL cannot compile in two
threads of one process (its MLIR context belongs to the thread that made it: a second
thread fails with "An MLIR function requires a Location"), so the kernels compile in
worker processes instead. At a plan's first call a kernel that is neither in memory nor in
the disk cache is queued here and its segment runs on the reference backend for that call
(its outputs copied into the kernel's layout, ``SegmentKernel.conform``); the whole step
queues its kernels before any is waited for. A segment whose reference run would hold much
memory (a loss's fp32 logits: ``plan.REFERENCE_BYTES_TO_DEFER``) compiles at once instead,
so the first step's memory stays near the kernels'. A later call waits for the kernels it runs
and loads them from the disk cache, where the worker wrote them (``cache.py``). A kernel a
worker failed to build is compiled in the calling process, which then raises what the
worker hit, so the failure reaches the usual fallback and its warning.

Workers are ``python -c`` subprocesses (``COMMAND``) that serve ``_serve``, not a
``multiprocessing`` pool: a spawned pool re-runs the user's main script in every worker.
A job travels as a pickle of the kernel's programs and geometries (or, for a kernel that is
no segment's, the loss gradient's scaling, the function that compiles it and its arguments),
framed by its length.
``THUNDER_FUSER_COMPILE_WORKERS=N`` sets how many (default: up to 8, two CPU cores kept
for the process that trains; ``0`` compiles in the calling process, at the first call, as
before). They start with ``thunder_fuser.executors()`` on a CUDA machine, else when the fusion
pass meets a trace that takes CUDA tensors (their imports take seconds, which then overlap
thunder's work), and stay until the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future

from thunder_fuser.backends.cute import cache, progress
from thunder_fuser import config

_jobs: queue.Queue = queue.Queue()
_pending: dict[str, Future] = {}
_workers: list[subprocess.Popen] = []
_feeders: list[threading.Thread] = []  # one thread per worker: sends its jobs, reads its answers
_lock = threading.Lock()
_broken: list[str] = []  # why workers stopped (one died): from then on the calling process compiles


_paused = [0]  # ``paused`` depth


@contextlib.contextmanager
def paused():
    """Nothing is queued inside: a plan's first call compiles its kernels and runs them (a
    CUDA graph's capture, which must record the kernels, not the reference backend)."""
    _paused[0] += 1
    try:
        yield
    finally:
        _paused[0] -= 1


def count() -> int:
    """How many workers compile kernels (0: none, the calling process compiles)."""
    if _paused[0]:
        return 0
    v = config.integer("THUNDER_FUSER_COMPILE_WORKERS")
    if v is not None:
        return max(0, v)
    return min(8, max(0, (os.cpu_count() or 1) - 2))


def _available() -> bool:
    """Are workers wanted and usable? (A worker's kernel reaches the caller through the
    disk cache only.)"""
    return count() > 0 and not _broken and cache.disk_cache_on()


def submit(digest: str, call, arch: str) -> bool:
    """Queue the kernel of key ``digest`` for a worker: ``call()`` gives ``(module, function,
    args)``, which the worker calls as ``function(*args, directory=...)`` to compile that
    kernel into the disk cache (None: what it needs cannot travel; a segment's members:
    ``segment_kernel.compile_members``, the loss gradient's scaling:
    ``scale_unless_one.py``). ``call`` runs only once the kernel is known to be neither
    queued, in memory nor on disk. False where there is nothing to wait for: it is in memory
    or on disk, workers are off, or the job cannot travel. The workers know no kernel family:
    they import what each job names."""
    return _queue(digest, arch, call)


def _queue(digest: str, arch: str, job) -> bool:
    """``job()`` makes what travels (None: it cannot), only once the kernel is known to be
    neither queued, in memory nor on disk."""
    if digest in _pending:
        return True
    if not _available() or cache.cached(digest):
        return False
    payload = job()
    if payload is None:
        return False
    start(arch)
    fut: Future = Future()
    _pending[digest] = fut
    _jobs.put((pickle.dumps((digest, payload, arch, str(cache.cache_dir()))), fut))
    cache.stats["queued"] += 1
    progress.report(cache.stats, f"queued for {count()} worker processes")
    return True


def start(arch: str) -> None:
    """Start the workers now (the fusion pass does, where a trace takes CUDA tensors), each
    compiling a kernel that does nothing for ``arch`` while it waits for its first job: CuTe
    DSL's own start (0.6 of a first kernel's 0.9 s on the CPU machine) then overlaps
    thunder's work rather than the first step's kernels."""
    if not _available():
        return
    with _lock:
        while len(_workers) < count():
            _start_worker(arch)


def start_for_cuda() -> None:
    """``start`` for this machine's GPU, where CuTe kernels run on it (``executors()`` on a
    CUDA machine, the fusion pass at a trace that takes CUDA tensors)."""
    import torch

    from thunder_fuser.backends.cute.backend import arch_of, cute_on

    if torch.cuda.is_available() and cute_on("cuda"):
        start(arch_of(torch.device("cuda")))


def wait(digest: str) -> None:
    """Block until a worker has finished the kernel of key ``digest`` where one was given it
    (it is then on disk, or the calling process compiles it and raises what the worker hit)."""
    fut = _pending.pop(digest, None)
    if fut is not None:
        try:
            fut.result(timeout=WAIT_S)
        except TimeoutError:  # a stuck worker: the caller compiles it
            pass


WAIT_S = 600.0


# A worker imports the kernel modules without the package's ``__init__``, which imports
# thunder: 8 of a worker's 15 s of imports on the H100 machine's host (torch 5-7 s, CuTe DSL
# 1 s), so a worker started at the fusion pass was still importing when its first kernel came.
# The bootstrap stands an empty package in for ``thunder_fuser`` with the real one's path.
_BOOTSTRAP = (
    "import sys, types; p = types.ModuleType('thunder_fuser'); p.__path__ = [sys.argv[1]]; "
    "sys.modules['thunder_fuser'] = p; "
    "from thunder_fuser.backends.cute.compile_workers import _serve; _serve(sys.argv[2])"
)
_PACKAGE_DIR = os.path.abspath(__file__)
for _ in range(__name__.count(".")):  # this module's folder, up to the package's own
    _PACKAGE_DIR = os.path.dirname(_PACKAGE_DIR)
COMMAND = [sys.executable, "-c", _BOOTSTRAP, _PACKAGE_DIR]


def _start_worker(arch: str) -> None:
    env = dict(config.environment(), PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env["THUNDER_FUSER_COMPILE_WORKERS"] = "0"
    env["CUDA_VISIBLE_DEVICES"] = ""  # compiling for ``arch`` needs no GPU: no CUDA context per worker
    proc = subprocess.Popen(COMMAND + [arch], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env)
    _workers.append(proc)
    feeder = threading.Thread(target=_feed, args=(proc,), daemon=True, name="thunder_fuser compile worker")
    _feeders.append(feeder)
    feeder.start()


def _feed(proc: subprocess.Popen) -> None:
    """One worker's jobs, one at a time: send, then read its answer (None, or the error's
    text). A worker that dies fails its job; the waiting call then compiles it itself."""
    while True:
        job, fut = _jobs.get()
        if job is None:  # ``shutdown``
            return
        try:
            _write(proc.stdin, job)
            error = pickle.loads(_read(proc.stdout))
        except Exception as e:  # noqa: BLE001 - a dead worker: every queued job falls to the caller
            _broken.append(f"a compile worker died: {type(e).__name__}: {e}")
            fut.set_result(_broken[-1])
            _fail_queued(_broken[-1])
            return
        fut.set_result(error)


def _fail_queued(why: str) -> None:
    """Answer every job still queued with ``why``: their callers compile them."""
    while True:
        try:
            job, fut = _jobs.get_nowait()
        except queue.Empty:
            return
        if job is None:
            _jobs.put((None, None))  # another feeder's stop: leave it for that feeder
            return
        fut.set_result(why)


def _write(f, data: bytes) -> None:
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _read(f) -> bytes:
    head = f.read(8)
    if len(head) < 8:
        raise EOFError("worker closed its pipe")
    (n,) = struct.unpack("<Q", head)
    return f.read(n)


@atexit.register
def shutdown() -> None:
    """Stop the workers (each exits at the end of its input) and forget their state; the
    next kernel queued starts new ones."""
    with _lock:
        _fail_queued("the compile workers were shut down")
        for _ in _workers:
            _jobs.put((None, None))
        for proc in _workers:
            try:
                proc.stdin.close()
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - a stuck worker is killed
                proc.kill()
        for feeder in _feeders:  # each has read its last answer and taken its stop
            feeder.join(timeout=5)
        for proc in _workers:
            proc.stdout.close()
        _workers.clear()
        _feeders.clear()
        _broken.clear()


def _warm_up(arch: str) -> None:
    """Compile a kernel that does nothing (``start``); a failure here is the first job's to meet."""
    try:
        import cutlass.cute as cute

        @cute.kernel
        def nothing():
            pass

        @cute.jit
        def launch():
            nothing().launch(grid=(1, 1, 1), block=(32, 1, 1))

        cute.compile(launch, options=f"--gpu-arch {arch}")
    except Exception:  # noqa: BLE001 - only a head start
        pass


def _serve(arch: str) -> None:
    """The worker's loop: compile each job into the disk cache, answer None or the error."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the compiler prints must not reach the answers' pipe
    _warm_up(arch)

    while True:
        try:
            digest, (module, function, args), arch, directory = pickle.loads(_read(sys.stdin.buffer))
        except EOFError:
            return
        config.set_for_children("CUTE_DSL_ARCH", arch)
        error = None
        try:
            getattr(importlib.import_module(module), function)(*args, directory=directory)
        except Exception as e:  # noqa: BLE001 - reported; the caller compiles it again and raises
            error = f"{type(e).__name__}: {e}"[:500]
        cache.clear_memory()
        _write(out, pickle.dumps(error))


