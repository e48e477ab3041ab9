"""Edge between thunder and our IR: claim, partition, build, emit.

``fuser_ex`` claims the prims in ``ir/ops.py`` (and composite ops that flatten entirely
into them, which thunder's ``can_fuse`` allows), partitions the trace with thunder's own
dataflow partitioner, and turns each region into one fusion bound symbol whose callable
is a :class:`RegionRunner`. Everything between (functionalize, layout, segment) works on
the region IR.
"""

from __future__ import annotations

import time
import warnings

import torch
from thunder.core import dtypes, prims, utils
from thunder.core.proxies import Proxy, TensorProxy, unvariableify, variableify
from thunder.core.pytree import tree_flatten
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace
from thunder.core.transform_common import dce
from thunder.executors.passes import update_fusion_call_ctx
from thunder.extend import FusionExecutor, register_executor

from thunder_fuser.attention import cudnn_admits
from thunder_fuser.inspect import debug
from thunder_fuser.copy_prims import COPY_TO_OUT_ID, copy_to_out_
from thunder_fuser.passes.communication_schedule import schedule_communication
from thunder_fuser.passes.constant_writes import merge_constant_writes
from thunder_fuser.passes.dead_inputs import dead_inputs
from thunder_fuser.passes.eager_decompositions import eager_decompositions
from thunder_fuser.passes.eager_decompositions import register as register_eager_rules
from thunder_fuser.passes.hoist_externs import (contiguous_of_resizes, dissolve_runs, hoist_externs, hoist_reductions,
                                                hoist_views, join_across_externs)
from thunder_fuser.passes.grouped_query_attention import grouped_kv_for_attention
from thunder_fuser.passes.input_aliases import needs_alias_guard, with_alias_guard
from thunder_fuser.passes.narrow_loss_gradient import narrow_loss_gradients
from thunder_fuser.passes.recompute_in_backward import recompute_in_backward
from thunder_fuser.passes.rematerialize import rematerialize_if_safe, writes_in_place
from thunder_fuser.rules.cross_entropy import STANDALONE
from thunder_fuser.rules.cross_entropy import register as register_losses
from thunder_fuser.passes.trace_notes import lift_notes, place_notes
from thunder_fuser.passes.writes_in_place import functional_writes_in_place
from thunder_fuser.functionalize import functionalize
from thunder_fuser.ir.cat_before_reshape import cat_before_reshape, pad_before_reshape
from thunder_fuser.ir.empty_pads import pads_of_empty_as_numbers
from thunder_fuser.ir.from_thunder import as_identity, build_region, flatten_to_supported
from thunder_fuser.ir.long_reductions import long_reductions_in_stages
from thunder_fuser.ir.ops import REDUCTION, SUPPORTED
from thunder_fuser.ir.reshape_first import reshape_first
from thunder_fuser.ir.same_values import same_values
from thunder_fuser.ir.scalar_broadcasts import read_scalars_unbroadcast
from thunder_fuser.ir.small_reductions import small_reductions_as_pointwise
from thunder_fuser.backends.cute import compile_workers
from thunder_fuser.layout import attention_reads, contiguous_for_attention_as_views, matmul_reads
from thunder_fuser.inspect.printing import op_line, segment_lines
from thunder_fuser.runtime.region_runner import RegionRunner, region_runner
from thunder_fuser.runtime.straight_line import StraightLineWarning
from thunder_fuser.segment import segment_region
from thunder_fuser import config

_UNSUPPORTED_DTYPES = (dtypes.complex32, dtypes.complex64, dtypes.complex128) + tuple(
    d for d in dtypes.all_dtypes if "float8" in str(d)
)


def _supported_value(x) -> bool:
    if isinstance(x, TensorProxy):
        # a shape of proxies (thunder's ``cache="symbolic values"``) changes from call to call:
        # a region's plan is specialized to the extents it was built for
        return (x.device.type in ("cpu", "cuda") and x.dtype not in _UNSUPPORTED_DTYPES
                and all(type(s) is int for s in x._shape))
    return True


def _checker(*args, **kwargs) -> bool:
    from thunder.core.pytree import tree_flatten

    flat, _ = tree_flatten((args, kwargs))
    return all(_supported_value(x) for x in flat)


class FusionBoundSymbol(BoundSymbol):
    """A fusion call that prints its segments under it instead of a flat op list."""

    def python(self, indent: int, commented: bool = False, print_depth: int = 1) -> list[str]:
        lines = self._get_lines(indent, commented=commented)
        if print_depth == 0:
            return lines
        runner = self._call_ctx.get(self.sym.name) if self._call_ctx else None
        if not isinstance(runner, RegionRunner):
            return BoundSymbol.python(self, indent, commented, print_depth)
        pad = "  " * (indent + 1)
        lines.extend(f"{pad}# {line}" for line in segment_lines(runner.segments))
        return lines


_FIRST_PASS = "partition: regions before rematerialization"


class FuserExecutor(FusionExecutor):
    def __init__(self):
        super().__init__("fuser", version=torch.__version__)
        self._fuel = float("inf")
        # during fusion_pass's final build: tensor name -> how a matmul of the trace reads it
        self._matmul_reads: dict[str, str] = {}
        self._attention_reads: frozenset[str] = frozenset()  # ... and those attention reads
        self._copyable: frozenset[str] = frozenset()  # names whose aliasing nothing observes
        self._dead_inputs: dict = {}  # a fusion's output names -> its inputs it may write over
        self._kept_apart: frozenset[int] = frozenset()  # during fusion_pass: ``contiguous_of_resizes``
        # which of fusion_pass's two builds of each region runs (the dumps name it)
        self._pass = _FIRST_PASS
        for name in SUPPORTED:
            sym = copy_to_out_ if name == "copy_to_out_" else getattr(prims, name)
            self.register_supported(sym.id, _checker)
        # ids of the composite ops claimed with rules of our own
        self._owned = register_losses(self) | register_eager_rules(self)

    def can_fuse(self, bsym: BoundSymbol) -> bool:
        # an op we own is ours only where its checker takes it: thunder asks an executor
        # that can fuse an op for its grad transform without the checker, so a loss our
        # rule does not cover (probability targets) must not look fusible as a whole
        if bsym.sym.id in self._owned:
            return self.can_execute(bsym)
        if bsym.sym.id in STANDALONE:  # ops of their own between regions (a kernel apart, a note)
            return False
        if id(bsym) in self._kept_apart:
            return False
        return self._can_fuse_prims(bsym)

    def _can_fuse_prims(self, bsym: BoundSymbol) -> bool:
        # a no-op conversion (``x.half()`` of a half tensor) has no decomposition in thunder;
        # claiming it keeps the ops around it in one region
        if as_identity(bsym) is not None:
            return _checker(*bsym.args, **bsym.kwargs)
        return super().can_fuse(bsym)

    def get_fuel(self, amount: int = 1, /) -> bool:
        if self._fuel < amount:
            return False
        self._fuel -= amount
        return True

    def set_fuel(self, value):
        self._fuel = float("inf") if value is None or not isinstance(value, int) else value

    def fuse(self, region, fusion_counter: int) -> BoundSymbol:
        inputs: list[Proxy] = [unvariableify(x) for x in region.inputs]
        outputs: list[Proxy] = [unvariableify(x) for x in region.outputs]
        flat: list[BoundSymbol] = []
        for bsym in region.bound_symbols:
            flat.extend(flatten_to_supported(bsym))
        writes = [b for b in flat if b.sym.id in (prims.PrimIDs.COPY_, COPY_TO_OUT_ID)]
        if not outputs and writes:
            # thunder drops fusions without outputs; a region whose only effect is a write
            # returns the written tensor so the update is never lost
            outputs = [writes[-1].output]
        name = f"fuser{fusion_counter}"
        ir = build_region(name, flat, inputs, outputs)
        ir.grad_enabled = _grad_enabled_at_trace_time()
        ir.matmul_reads = {o.name: self._matmul_reads[o.name] for o in outputs if o.name in self._matmul_reads}
        ir.attention_reads = frozenset(o.name for o in outputs if o.name in self._attention_reads)
        ir.copyable_outputs = frozenset(o.name for o in outputs if o.name in self._copyable)
        ir.dead_inputs = self._dead_inputs.get(tuple(o.name for o in outputs), frozenset())
        title = f"{name} ({self._pass})"
        debug.dump("region", lambda: "\n".join([title] + [op_line(n) for n in ir.nodes]))
        functionalize(ir)
        same_values(ir)
        read_scalars_unbroadcast(ir)
        pads_of_empty_as_numbers(ir)
        cat_before_reshape(ir)
        pad_before_reshape(ir)
        small_reductions_as_pointwise(ir)
        long_reductions_in_stages(ir)
        reshape_first(ir)
        contiguous_for_attention_as_views(ir)
        segments = segment_region(ir)
        debug.dump("segments", lambda: "\n".join([title] + segment_lines(segments)))
        runner = region_runner(ir, segments)
        subsymbols = _with_copy_to_out(flat, ir)
        sym = Symbol(name, meta=None, is_fusion=True, executor=self, _bind_postprocess=_keep_segment_printing)
        return FusionBoundSymbol(sym, tuple(inputs), {}, tuple(outputs), tuple(subsymbols), _call_ctx={name: runner})

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        start = time.perf_counter_ns()
        from thunder.executors.data_dependent_partition import Node, fuse_bound_symbols

        trace = grouped_kv_for_attention(eager_decompositions(trace), cudnn_admits)
        guarded = needs_alias_guard(trace)
        trace = narrow_loss_gradients(trace)
        if config.flag("THUNDER_FUSER_RECOMPUTE"):
            trace = recompute_in_backward(trace, self.can_fuse)
        trace = merge_constant_writes(functional_writes_in_place(trace))
        self._kept_apart = contiguous_of_resizes(trace.bound_symbols)
        if _on_cuda(trace):  # their start (imports: seconds) overlaps the rest of the first call
            compile_workers.start_for_cuda()
        producers, consumers = utils.producers_and_consumers(trace)

        def _should_fuse(a: Node, b: Node) -> bool:
            def ok(n: Node) -> bool:
                return len(n.group_bsyms) > 1 or self.can_fuse(n.group_bsyms[0])

            return ok(a) and ok(b)

        fused: list[tuple[BoundSymbol, list[BoundSymbol]]] = []  # (fused or kept symbol, what it holds)
        counter = 0
        noted = from_trace(trace)
        noted.bound_symbols, notes = lift_notes(trace.bound_symbols)
        ours = {id(b) for b in noted.bound_symbols if self.can_fuse(b)}  # asked once: both passes ask often
        claimed = lambda b: id(b) in ours  # noqa: E731
        # a wait and what is made of its result alone go to their first reader, before the
        # partition: the ops we claim there then join that reader's region
        noted.bound_symbols = schedule_communication(noted.bound_symbols, hoist=False)
        noted.bound_symbols = join_across_externs(hoist_externs(hoist_views(noted.bound_symbols, claimed), claimed), claimed)
        noted.bound_symbols = hoist_reductions(noted.bound_symbols, claimed)
        if _dissolving():
            noted.bound_symbols, released = dissolve_runs(noted.bound_symbols, claimed)
            self._kept_apart |= released  # views torch takes between matmuls, in no region
        for bsyms in fuse_bound_symbols(noted, _should_fuse):
            if len(bsyms) == 1 and not self.can_fuse(bsyms[0]):
                fused.append((bsyms[0], bsyms))
                continue
            if not self.get_fuel():
                fused.extend((b, [b]) for b in bsyms)
                continue
            fused.append((self.fuse(_thunder_region(producers, consumers, bsyms), counter), bsyms))
            counter += 1
        out = from_trace(trace)
        out.bound_symbols = place_notes(fused, notes)
        out = rematerialize_if_safe(out)
        out = dce(out)
        out.bound_symbols = schedule_communication(out.bound_symbols)
        # the fusions are built again, for the final trace: now each knows which of its
        # outputs a matmul reads, and lays them out for it
        # what the caller receives keeps eager's strides, whoever reads it here (ThunderFX hands a
        # piece's outputs to Inductor's pieces, which assert them)
        handed_out = _handed_out(out)
        self._matmul_reads = {k: v for k, v in matmul_reads(_matmul_calls(out.bound_symbols)).items()
                              if k not in handed_out}
        self._attention_reads = attention_reads(_calls(out.bound_symbols)) - _layouts_handed_out(out, handed_out)
        self._copyable = _unobserved_aliasing(out)
        try:
            self._dead_inputs = dead_inputs(out)
        except Exception as e:  # noqa: BLE001 - an optimization: a trace it cannot read donates nothing
            # (a bug of ours all the same: the test suite makes this warning an error)
            warnings.warn(f"no dead inputs found ({type(e).__name__}: {e})", StraightLineWarning)
            self._dead_inputs = {}
        self._pass = "final build: the regions the trace calls"
        try:
            out = update_fusion_call_ctx(out)
        finally:
            self._pass = _FIRST_PASS
            self._matmul_reads, self._copyable, self._dead_inputs = {}, frozenset(), {}
            self._attention_reads = frozenset()
            self._kept_apart = frozenset()
        if guarded:  # after fusion: an input thunder replaced has no unpacking, which fusion's dataflow needs
            out = with_alias_guard(out)
        ms = (time.perf_counter_ns() - start) // 1_000_000
        out.set_provenance(TraceProvenance(f"thunder_fuser fusion (took {ms} milliseconds)"))
        return out


def _thunder_region(producers, consumers, bsyms: list):
    """What ``thunder.executors.utils.Region`` gives a fusion (its bound symbols, and the
    proxies it reads from before it and those read after it, in trace order), with the
    region's symbols a set of identities: thunder's asks ``producer in bound_symbols`` of a
    list, each test a structural comparison, quadratic in the region's size (164 of a 600 s
    first call under cProfile: a foreach AdamW over 148 parameters, one region)."""
    from types import SimpleNamespace

    from thunder.core.transform_common import order_proxies
    from thunder.executors.utils import comment_symbols

    mine = {id(b) for b in bsyms}
    consumed: dict[str, Proxy] = {}
    produced: dict[str, Proxy] = {}
    for bsym in bsyms:
        for x in bsym.flat_outs:
            if isinstance(x, Proxy) and id(producers.get(x, None)) in mine:
                produced.setdefault(x.name, x)
        if bsym.sym.id not in comment_symbols:
            for x in bsym.flat_args:
                if isinstance(x, Proxy):
                    consumed.setdefault(x.name, x)
    inputs = [x for x in consumed.values() if id(producers.get(x, None)) not in mine]
    outputs = [x for x in produced.values() if any(id(c) not in mine for c in consumers.get(x, ()))]
    order = order_proxies(bsyms)
    by_order = lambda x: order[x.name]  # noqa: E731
    return SimpleNamespace(bound_symbols=bsyms, inputs=[variableify(x) for x in sorted(inputs, key=by_order)],
                           outputs=[variableify(x) for x in sorted(outputs, key=by_order)])


# by symbol name: the same for thunder's torch-level symbols, its prims and the torch
# executor's implementations, which is what the trace holds by the time fusion passes run
_MATMUL_NAMES = {"matmul": "matmul", "bmm": "matmul", "linear": "linear"}


def _dissolving() -> bool:
    """``hoist_externs.dissolve_runs``, on unless ``THUNDER_FUSER_DISSOLVE=0`` (read at each
    fusion pass: a step traced with it off keeps the regions it made)."""
    return config.flag("THUNDER_FUSER_DISSOLVE")


def _on_cuda(trace: TraceCtx) -> bool:
    """Does the trace take a CUDA tensor?"""
    try:
        args = tree_flatten((trace.args, trace.kwargs))[0]
    except TypeError:  # an argument pytree cannot flatten: no early start (the first kernel starts them)
        return False
    return any(isinstance(a, TensorProxy) and a.device.type == "cuda" for a in args)


def _calls(bsyms):
    """``(op name, argument names)`` of each call in ``bsyms`` (None for a non-tensor)."""
    for b in bsyms:
        yield b.sym.name, tuple(a.name if isinstance(a, TensorProxy) else None for a in b.args)


# attention op -> for each output, the argument position whose layout it follows (None: laid
# out afresh): the forward's output like its query, the backward's gradients like q, k, v
_LAYOUT_FROM = {"fuser_attention_forward": (0, None, None, None), "fuser_attention_backward": (1, 2, 3)}


def _layouts_handed_out(trace: TraceCtx, handed_out: frozenset[str]) -> frozenset[str]:
    """Names whose layout decides the strides of a tensor the caller receives: the handed-out
    tensors and, back from each, the tensors what made it lays its output out from (a
    region's inputs, a view's source, attention's query), up to a matmul or a reduction,
    whose results are laid out afresh. Attention's operands among them keep the program's
    layout: a region's output made of attention's and handed back came out heads inside the
    sequence where eager's is contiguous."""
    kept = set(handed_out)
    _follow_layouts_back(trace.bound_symbols, kept)
    return frozenset(kept)


def _follow_layouts_back(bsyms, kept: set) -> None:
    """Add to ``kept`` (names) the tensors the layouts of those in it follow, through
    ``bsyms`` backward (``_layouts_handed_out``); inside a fusion, through its prims, where a
    reduction's result is laid out afresh (``layout/allocation_order``) as a matmul's is."""
    for b in reversed(bsyms):
        if b.sym.name in _MATMUL_NAMES or b.sym.name in REDUCTION or not any(o.name in kept for o in b.flat_proxy_outs):
            continue
        if b.sym.is_fusion:
            inside = {o.name for o in b.flat_proxy_outs if o.name in kept}
            _follow_layouts_back(b.subsymbols, inside)
            kept.update(a.name for a in b.flat_proxy_args if a.name in inside)
            continue
        positions = _LAYOUT_FROM.get(b.sym.name)
        if positions is None:
            args = b.flat_proxy_args
        else:
            args = [b.args[i] for o, i in zip(b.flat_proxy_outs, positions) if o.name in kept and i is not None]
        kept.update(a.name for a in args if isinstance(a, TensorProxy))


def _handed_out(trace: TraceCtx) -> frozenset[str]:
    """Names of the tensors ``trace`` returns to its caller: a forward trace's ``output`` (not
    what it saves for the backward), else everything it returns."""
    ret = trace.bound_symbols[-1] if trace.bound_symbols else None
    if ret is None or ret.sym.id != prims.PrimIDs.RETURN:
        return frozenset()
    given = ret.args
    if len(given) == 2 and isinstance(given[0], dict) and "output" in given[0]:
        given = given[0]["output"]
    return frozenset(p.name for p in tree_flatten(given)[0] if isinstance(p, TensorProxy))


def _matmul_calls(bsyms):
    """``(op, operand ranks, operand names)`` of each matmul-like call in ``bsyms``."""
    for b in bsyms:
        op = _MATMUL_NAMES.get(b.sym.name)
        if op is None or len(b.args) < 2 or not all(isinstance(a, TensorProxy) for a in b.args[:2]):
            continue
        yield op, tuple(a.ndim for a in b.args[:2]), tuple(a.name for a in b.args[:2])


def _unobserved_aliasing(trace: TraceCtx) -> frozenset[str]:
    """Names of the tensors in ``trace`` that may be copies rather than views: all that it
    does not return, where it writes nothing in place (the same guard as rematerialization's)."""
    if writes_in_place(trace.bound_symbols):
        return frozenset()
    from thunder.core.pytree import tree_flatten

    returned = {x.name for x in tree_flatten(trace.output)[0] if isinstance(x, Proxy)}
    return frozenset(p.name for b in trace.bound_symbols for p in b.flat_proxy_outs if p.name not in returned)


def _grad_enabled_at_trace_time() -> bool:
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    return bool(getattr(cd, "is_grad_enabled", False)) if cd is not None else False


def _keep_segment_printing(bsym: BoundSymbol) -> None:
    # thunder's passes rebuild bound symbols as plain BoundSymbols (``from_bsym``) and then
    # call the symbol's bind hook: restore the class that prints segments.
    bsym.__class__ = FusionBoundSymbol


def _with_copy_to_out(flat: list[BoundSymbol], ir) -> list[BoundSymbol]:
    """The fusion's subsymbols, with each ``copy_`` that functionalize rewrote shown as
    ``copy_to_out_`` (re-fusing them reproduces the same region)."""
    rewritten = ir.rewritten_copies
    out = []
    for b in flat:
        if b.sym.id == prims.PrimIDs.COPY_ and b.output.name in rewritten:
            computed, dst = b.args[0], b.args[1]
            b = copy_to_out_.bind(computed, out=dst, output=b.output)
        out.append(b)
    return out


fuser_ex = FuserExecutor()
register_executor(fuser_ex)
