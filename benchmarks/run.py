"""Run the suite on the GPU: every workload, every contender, one process, one device call.

    python -m benchmarks.run --out benchmarks/results

Contenders run on the same inputs in this process: eager, torch.compile, thunder (default
executors), thunder with its torch.compile executor, thunder with fuser_ex. Each output is
checked against eager before it is timed; a contender that fails is reported as failed with
the reason, never dropped. Writes ``latest.json``, ``results.csv``, ``results.md`` and
``chart.png`` under ``--out`` (see ``benchmarks/report.py``).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

# a workload's first call is checked against eager and timed as its compile: kernels
# compile in this process then, not in workers while the reference backend runs it (the
# loss benchmark, benchmarks/cross_entropy.py, imports this module before any call too)
os.environ.setdefault("THUNDER_FUSER_COMPILE_WORKERS", "0")

import torch

import thunder_fuser  # noqa: F401  (torch compat stubs before thunder)
import thunder
from thunder.executors.torch_compile import torch_compile_ex

from benchmarks import cli, report
from benchmarks.suite import Case, cases, nbytes
from benchmarks.timing import device_ms, host_us
from benchmarks.workloads import TransformerBlock
from thunder_fuser import fuser_ex
from thunder_fuser.backends.cute import backend
from thunder_fuser.backends.cute.backend import KernelFallbackWarning

CONTENDERS = ("eager", "torch.compile", "thunder", "thunder+torchcompile", "thunder+fuser")
L2_BYTES = 50 * 2**20


def _jit(kind, fn, executors=()):
    """``executors``: thunder executors placed before the contender's own (thunder's
    defaults hold them already)."""
    if kind == "eager":
        return fn
    if kind == "torch.compile":
        return torch.compile(fn)
    if kind == "thunder":
        return thunder.jit(fn)
    if kind == "thunder+torchcompile":
        return thunder.jit(fn, executors=[*executors, torch_compile_ex])
    return thunder.jit(fn, executors=[*executors, fuser_ex])


def _block_contender(kind, block, executors=()):
    model = block if kind == "eager" else _jit(kind, block, executors)

    def step(x):
        y = model(x)
        y.float().sum().backward()
        return y.detach()

    return step


def _clone(args):
    def one(a):
        if isinstance(a, torch.Tensor):
            c = a.detach().clone()
            return c.requires_grad_(a.requires_grad)
        if isinstance(a, (list, tuple)):
            return type(a)(one(x) for x in a)
        return a

    return tuple(one(a) for a in args)


def _check(got, want, dtype):
    tol = dict(atol=3e-2, rtol=3e-2) if dtype in (torch.bfloat16, torch.float16) else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


def same_size_copy(nbytes: int) -> float:
    """TB/s of a device-to-device copy that moves ``nbytes`` (read plus written, fp32
    buffers of half that each)."""
    a = torch.randn(max(1, nbytes // 8), device="cuda")
    b = torch.empty_like(a)
    ms, _ = device_ms(lambda: b.copy_(a), [()], reps=50)
    return 2 * a.numel() * 4 / ms / 1e9


def copy_bandwidth() -> float:
    """The reference copy: the best of copies of 256 MiB and 1 GiB buffers."""
    return max(same_size_copy(2 * 4 * n) for n in (2**26, 2**28))


def run_case(case: Case, copy_tbps: float, log) -> dict:
    torch.manual_seed(0)
    args = case.make()
    block = TransformerBlock().cuda().to(torch.bfloat16) if case.backward else None
    fn = case.fn
    pristine = _clone(args)  # timing runs update in-place workloads' inputs: checks start from these
    ref_args = _clone(pristine)
    want = _block_contender("eager", copy.deepcopy(block))(*ref_args) if block is not None else fn(*ref_args)
    if case.written and fn is not None:
        want = case.written(ref_args, want)
    dtype = next(t.dtype for t in _tensors(args))
    bytes_ = nbytes(case, args, want)
    sets = 1 if bytes_ >= L2_BYTES else 4
    arg_sets = [args] + [case.make() for _ in range(sets - 1)]
    results = {}
    for kind in CONTENDERS:
        try:
            f = _block_contender(kind, copy.deepcopy(block), case.executors) if block is not None else _jit(kind, fn)
            trial = _clone(pristine)
            backend.forget_warnings()  # each contender's fallbacks warn afresh (one warning per segment)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", KernelFallbackWarning)
                t0 = time.perf_counter()
                got = f(*trial)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
            fallbacks = [str(w.message) for w in caught if issubclass(w.category, KernelFallbackWarning)]
            if case.written and fn is not None:
                got = case.written(trial, got)
            _check(got, want, dtype)
            ms, graphed = device_ms(f, arg_sets, reps=50)
            entry = {"ms": ms, "TBps": bytes_ / ms / 1e9, "host_us": None, "compile_s": compile_s}
            if kind == "thunder+fuser":
                entry["fallbacks"] = fallbacks  # segments the first call ran on the reference backend
            if case.kind == "small":
                entry["host_us"] = host_us(f, arg_sets[0], calls=100)
            results[kind] = entry
            log.write(f"{case.name} {case.size} {kind}: {ms:.4f} ms graph={graphed}\n")
        except Exception as e:  # noqa: BLE001 - report, never drop
            results[kind] = {"ms": float("nan"), "TBps": float("nan"), "host_us": None, "compile_s": None,
                             "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
            log.write(f"{case.name} {case.size} {kind} FAILED\n{traceback.format_exc()}\n")
        log.flush()
    out = {"name": case.name, "size": case.size, "bytes": bytes_, "results": results}
    if case.kind == "large" and not case.backward and bytes_ < report.SAME_SIZE_COPY_BELOW:
        out["same_size_copy_TBps"] = same_size_copy(bytes_)
    return out


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def main(argv=None) -> int:
    ap = cli.parser("benchmarks.run", __doc__)
    ap.add_argument("--out", default="benchmarks/results", help="folder for the results and the chart")
    ap.add_argument("--only", default="", help="substring of workload names to run (all when empty)")
    opts = ap.parse_args(argv)
    cli.require_cuda("benchmarks.run", "The CPU's smoke test of the models: python -m benchmarks.models --tiny")
    os.makedirs(opts.out, exist_ok=True)
    # a fresh kernel cache: compile_s is a cold compile; report.py measures the warm cache after
    os.environ.setdefault("THUNDER_FUSER_CACHE", tempfile.mkdtemp(prefix="tf-cache-"))
    warnings.filterwarnings("ignore")  # but the fuser's fallbacks are recorded per workload (run_case)
    from tqdm import tqdm

    copy_tbps = copy_bandwidth()
    doc = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "copy_TBps": copy_tbps,
        "workloads": [],
    }
    todo = [c for c in cases() if opts.only in c.name]
    with open(os.path.join(opts.out, "run.log"), "w") as log:
        for case in tqdm(todo, desc="workloads", file=sys.stderr):
            doc["workloads"].append(run_case(case, copy_tbps, log))
            report.write_json(doc, opts.out)
    # the copy is measured again last; the higher of the two stands (clocks ramp up)
    doc["copy_TBps"] = max(copy_tbps, copy_bandwidth())
    report.write_all(doc, opts.out)
    warm = subprocess.run([sys.executable, "-m", "benchmarks.warm_cache"], capture_output=True, text=True)
    with open(os.path.join(opts.out, "warm_cache.json"), "w") as f:
        f.write(warm.stdout.strip().splitlines()[-1] if warm.stdout.strip() else json.dumps({"error": warm.stderr[-2000:]}))
    print(report.markdown(report.clean(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
