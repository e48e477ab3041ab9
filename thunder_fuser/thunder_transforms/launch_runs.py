"""The trace pass that groups region calls and the matmuls between them into launch runs.

``LaunchRuns`` is a thunder transform, one of ``thunder_fuser.transforms()`` unless
``launch_runs=False`` or ``THUNDER_FUSER_LAUNCH_RUNS=0``. After thunder has
optimized a computation or backward trace (dels placed), it finds each maximal run of calls
that launch kernels without reading a value on the host: our region calls, ``linear``,
``matmul`` of two matrices, with views (``permute``, ``reshape``) and ``del`` between them.
A run of at least two launching calls becomes a ``LaunchRun`` (``cudagraphs/launch_run.py``):

    run0_begin()
    (t527, t534) = fuser0(...)            # its launches handed to run0
    t1923 = run0_linear(t632, w, b)       # allocates; addmm launched at the flush
      # t1923 = torch.nn.functional.linear(t632, w, b)
    (t675,) = fuser1(t1923, t527, t534)
    # run0: fuser0, linear t1923, fuser1: launched as one CUDA graph keyed on their pointers
    run0_flush()
    (t850, ...) = fuser_attention_forward(...)

The flush sits before the first call after the run that is none of these (attention, an
embedding, the return), so every launch is made before anything that could read what it
writes. A reshape in the run is the run's (a view, or a flush and then torch's copy). Runs
are made only where region graphs are (a CUDA trace; ``region_graphs.wanted``), and only of
region calls this executor made.
"""

from __future__ import annotations

from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import from_trace, TraceProvenance
from thunder.core.transform_common import Transform

from thunder_fuser.cudagraphs import launch_run, region_graphs
from thunder_fuser.cudagraphs.launch_run import LaunchRun
from thunder_fuser.runtime.region_runner import RegionRunner

_TORCH_EX = "torch"
MIN_LAUNCHING = 2  # calls that launch, for a run to be worth a graph of its own
_VIEWS = {"permute"}  # torch ops that always return a view: no value read, nothing launched
_RESHAPES = {"reshape", "torch_prims_reshape_impl"}


class LaunchRuns(Transform):
    """Launch runs in every optimized computation and backward trace (module docstring)."""

    def transform_trace_post_optimization(self, trace, **kwargs):
        return launch_runs(trace)


def _runner(b: BoundSymbol):
    if not b.sym.is_fusion or not b._call_ctx:
        return None
    r = b._call_ctx.get(b.sym.name)
    return r if isinstance(r, RegionRunner) else None


def _torch_op(b: BoundSymbol) -> str | None:
    ex = b.sym.executor
    return b.sym.name if ex is not None and ex.name == _TORCH_EX else None


def _matrices(*xs) -> bool:
    return all(isinstance(x, TensorProxy) and x.ndim == 2 for x in xs)


def _kind(b: BoundSymbol) -> str | None:
    """"region", "matmul", "linear", "reshape", "view", "del", or None (ends a run)."""
    if _runner(b) is not None:
        return "region"
    if b.sym.id == prims.PrimIDs.DEL:
        return "del"
    op = _torch_op(b)
    if op is None or b.kwargs:
        return None
    if op == "matmul" and len(b.args) == 2 and _matrices(*b.args):
        return "matmul"
    if op == "linear" and 2 <= len(b.args) <= 3:
        x, w, bias = (*b.args, None)[:3]
        if (isinstance(x, TensorProxy) and x.ndim >= 2 and _matrices(w)
                and (bias is None or (isinstance(bias, TensorProxy) and bias.ndim == 1))):
            return "linear"
        return None
    if op in _RESHAPES and len(b.args) == 2 and isinstance(b.args[0], TensorProxy):
        return "reshape"
    if op in _VIEWS:
        return "view"
    return None


def _wanted(bsyms) -> bool:
    for b in bsyms:
        if _runner(b) is not None:
            devices = [a.device for a in b.flat_args if isinstance(a, TensorProxy)]
            return bool(devices) and region_graphs.wanted(devices[0])
    return False


def launch_runs(trace):
    """``trace`` with its launch runs (module docstring); as it is where there are none."""
    bsyms = list(trace.bound_symbols)
    if not _wanted(bsyms):
        return trace
    kinds = [_kind(b) for b in bsyms]
    out: list[BoundSymbol] = []
    count, i = 0, 0
    while i < len(bsyms):
        if kinds[i] not in _LAUNCHING:
            out.append(bsyms[i])
            i += 1
            continue
        j = i
        while j < len(bsyms) and kinds[j] is not None:
            j += 1
        for group in _held_apart(bsyms[i:j], kinds[i:j]):
            if sum(k in _LAUNCHING for _, k in group) < MIN_LAUNCHING:
                out.extend(b for b, _ in group)
                continue
            out.extend(_as_run(LaunchRun(f"run{count}"), group))
            count += 1
        i = j
    if count == 0:
        return trace
    new = from_trace(trace)
    new.bound_symbols = out
    new.set_provenance(TraceProvenance(f"thunder_fuser launch runs ({count})"))
    return new


_LAUNCHING = ("region", "matmul", "linear")


def _held_apart(members: list, kinds: list) -> list[list]:
    """The run's members in groups, each ending at the ``del`` past which the tensors they
    read and the trace deletes would exceed ``HELD_BYTES``: a deferred launch holds what it
    reads, so a tensor deleted after the launch that reads it is freed at the flush (the
    logits' gradient, 206 MB in pythia, read by two matmuls at the top of the backward)."""
    groups, group, read, held = [], [], set(), 0
    for b, k in zip(members, kinds):
        group.append((b, k))
        if k == "del":
            held += sum(_bytes(p) for p in b.flat_proxy_args if p.name in read)
            if held > launch_run.HELD_BYTES:
                groups.append(group)
                group, read, held = [], set(), 0
        else:
            read.update(p.name for p in b.flat_proxy_args)
    return groups + ([group] if group else [])


def _bytes(p) -> int:
    if not isinstance(p, TensorProxy):
        return 0
    n = p.dtype.bytes
    for d in p.shape:
        n *= d
    return n


def _as_run(run: LaunchRun, group: list) -> list[BoundSymbol]:
    out = [_call(f"{run.name}_begin", run.begin, (), None)]
    for b, k in group:
        if k == "region":
            _runner(b).run = run
            out.append(b)
        elif k in ("matmul", "linear", "reshape"):
            out.append(_call(f"{run.name}_{k}", getattr(run, k), b.args, b.output, b))
        else:
            out.append(b)
    what = ", ".join(_runner(b).region.name if k == "region" else f"{b.sym.name} {b.output.name}"
                     for b, k in group if k in _LAUNCHING)
    out.append(_call(f"{run.name}_flush", run.flush, (), None,
                     header=f"{run.name}: {what}: launched as one CUDA graph keyed on their pointers"))
    return out


def _call(name: str, fn, args: tuple, output, replaced: BoundSymbol | None = None, header: str = "") -> BoundSymbol:
    sym = Symbol(name, meta=None)
    return BoundSymbol(sym, args=tuple(args), kwargs={}, output=output,
                       subsymbols=(replaced,) if replaced is not None else (), header=header,
                       _call_ctx={name: fn})
