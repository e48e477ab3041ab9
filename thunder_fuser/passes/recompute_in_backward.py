"""Recompute in the backward a pointwise value the backward reads, rather than save it.

thunder splits the joint trace after the fusion passes (``split_into_forward_and_backward``):
every forward value a backward op reads is saved, held from the forward to its use. A value
the forward computes pointwise from others the backward reads anyway costs nothing to make
again there. SwiGLU's product ``silu(fc1) * fc2`` is the down projection's input, which its
weight gradient (a matmul, not ours) reads: saved beside ``fc1`` and ``fc2`` (which the
SwiGLU backward reads), it held one more ``[tokens, 8192]`` a layer (1 GiB over the 16
layers of Llama-3.2-1B at 4096 tokens); a norm's output, which the next projection's weight
gradient reads, is made again from the norm's input and statistics. thunder's own
rematerialization (``passes/rematerialize.py``) moves work between two fusions, one reading
the other's outputs; a matmul or attention reader is no fusion, so it never sees these.

The rule. The candidates are the saved tensors a backward op we do not claim reads (a
matmul, attention; through views we claim): one only our fusions read is thunder's pass's
to move. For each, walk back through its producers while they are pointwise or view ops we
claim, stopping at a value held anyway (free: an input, a saved value no pointwise op
makes, or the source of a saved conversion, which thunder's pass saves in its place) or at
anything else (then saved instead: its bytes are the cost). Where the cost is below the
tensor's own bytes it is chosen, and what it then saves is free for the walks after it
(to a fixed point). The walked ops of every chosen tensor are cloned once, with fresh
names and thunder's backward tag, in front of the first backward op that reads it, and the
backward reads the clones; the fusion pass fuses them with the backward's ops around, and
the split saves the clones' inputs. Recomputed with the same prims (each rounding as
traced), a clone's values are the forward's, bit for bit.

Measured on the CPU (``python -m benchmarks.saved_bytes``, what autograd holds a layer at
512 tokens, bf16; ``benchmarks/RESULTS.md``): litgpt's Llama-3.2-1B 40.1 MiB before, 32.1
after (torch.compile 40.1), Qwen2.5-1.5B 38.3 -> 29.5, OLMo-1B 44.0 -> 36.0, pythia-1b
34.0 -> 26.0, phi-2 40.1 -> 30.1, transformers' Llama 40.1 -> 30.6; GPT-2 unchanged.
Grouped-query attention's K and V expanded to every head (four times K and V) stay held:
made again by views alone, they would be torch copies outside our regions (see
``_views_only``'s caller). ``THUNDER_FUSER_RECOMPUTE=0`` turns it off.

Run only on a trace with no in-place write, for the reason ``passes/rematerialize.py``
gives: a value recomputed later could read what a write changed in between.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder.core import prims
from thunder.core.pytree import tree_iter
from thunder.core.symbol import BoundSymbol, BoundSymbolTag
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.core.utils import producers_and_consumers
from thunder.core.proxies import Proxy, TensorProxy, Variable, variableify

from thunder_fuser.ir.from_thunder import prim_names
from thunder_fuser.ir.ops import CAST, POINTWISE, VIEW
from thunder_fuser.passes.rematerialize import writes_in_place

_RECOMPUTABLE = frozenset(POINTWISE + VIEW)
_MAX_OPS = 64  # ops walked back for one saved tensor


def _forward_names(bsyms: list[BoundSymbol], ret: BoundSymbol) -> tuple[set[int], set[str]]:
    """The forward part as thunder's split finds it (reverse dataflow from the forward's
    outputs and the trace's inputs): the ids of its bound symbols and the names it defines."""
    names = {p.name for p in tree_iter(ret.args[0]["fw_flat_out"]) if isinstance(p, Proxy)}
    names |= {p.name for p in ret.args[0]["flat_args"] if isinstance(p, Proxy)}
    ids: set[int] = set()
    for b in reversed(bsyms):
        if b is ret or b.sym.id == prims.PrimIDs.GET_GRAD:
            continue
        if any(o.name in names for o in b.flat_proxy_outs) or b.sym.id == prims.PrimIDs.UNPACK_TRIVIAL:
            ids.add(id(b))
            names |= {p.name for p in b.flat_proxy_args} | {o.name for o in b.flat_proxy_outs}
    return ids, names


def _only(b: BoundSymbol, allowed) -> bool:
    """Does ``b`` come down to prims of ``allowed`` alone?"""
    names = prim_names(b)
    return names is not None and names <= set(allowed)


def _converted_from(t: TensorProxy, producer) -> TensorProxy | None:
    """The tensor ``t`` is a conversion or view of (through ops of one input each), where
    that tensor is no larger: thunder's rematerialization then passes it, not ``t``."""
    x = t
    while (p := producer.get(x, None)) is not None and _only(p, CAST + VIEW):
        args = [a for a in p.flat_proxy_args if isinstance(a, TensorProxy)]
        if len(args) != 1:
            break
        x = args[0]
    if x is t:
        return None
    a, b = _bytes(x), _bytes(t)
    return x if a is not None and b is not None and a <= b else None


def _views_only(ops: list[BoundSymbol]) -> bool:
    return all(_only(b, VIEW) for b in ops)


def _bytes(t: TensorProxy) -> int | None:
    n = 1
    for s in t.shape:
        if not isinstance(s, int):
            return None
        n *= s
    return n * t.dtype.bytes


def _walk_back(t: TensorProxy, producer_of: Callable, free: Callable[[TensorProxy], bool],
               recomputable: Callable[[BoundSymbol], bool]) -> tuple[list[BoundSymbol], dict[str, int]] | None:
    """The ops that make ``t`` again from free values (in no order yet) and the values it
    stops at that are not free, with their bytes; None where ``t``'s producer is no op to
    repeat."""
    first = producer_of(t)
    if first is None or not recomputable(first):
        return None
    ops: dict[int, BoundSymbol] = {}
    stops: dict[str, int] = {}
    todo = [first]
    while todo:
        b = todo.pop()
        if id(b) in ops:
            continue
        if len(ops) == _MAX_OPS:
            return None
        ops[id(b)] = b
        for a in b.flat_proxy_args:
            if not isinstance(a, TensorProxy) or free(a) or a.name in stops:
                continue
            p = producer_of(a)
            if p is not None and recomputable(p):
                todo.append(p)
            else:
                size = _bytes(a)
                if size is None:
                    return None
                stops[a.name] = size
    return list(ops.values()), stops


def recompute_in_backward(trace: TraceCtx, claimed: Callable[[BoundSymbol], bool]) -> TraceCtx:
    """``trace`` (a joint forward-backward trace) with each saved tensor that is cheaper to
    make again in the backward made there, from the ops ``claimed`` says we run; ``trace``
    itself where none is, where it is no joint trace or where it writes in place."""
    bsyms = list(trace.bound_symbols)
    if not bsyms or bsyms[-1].sym.id != prims.PrimIDs.RETURN or writes_in_place(bsyms):
        return trace
    claimed = _asked_once(claimed)  # the executor's claim is not cheap; the walks ask often

    ret = bsyms[-1]
    if not isinstance(ret.args[0], dict) or "fw_flat_out" not in ret.args[0]:
        return trace
    forward, fw_names = _forward_names(bsyms, ret)
    backward = [b for b in bsyms if id(b) not in forward and b is not ret and b.sym.id != prims.PrimIDs.GET_GRAD]
    saved: dict[str, TensorProxy] = {}
    for b in backward:
        for a in b.flat_proxy_args:
            if a.name in fw_names and isinstance(a, TensorProxy):
                saved.setdefault(a.name, a)
    inputs = {p.name for p in ret.args[0]["flat_args"] if isinstance(p, Proxy)}
    # held anyway: the forward's outputs go to the caller
    inputs |= {p.name for p in tree_iter(ret.args[0]["fw_flat_out"]) if isinstance(p, Proxy)}
    producer, consumers = producers_and_consumers(trace)
    in_backward = {id(b) for b in backward}
    verdict: dict[int, bool] = {}

    def read_by_no_fusion(t: TensorProxy) -> bool:
        """Does an op we do not claim read ``t`` in the backward (through views we claim)?"""
        todo, seen = [t], set()
        while todo:
            x = todo.pop()
            for c in consumers.get(x, ()):
                if id(c) not in in_backward or id(c) in seen:
                    continue
                seen.add(id(c))
                if not claimed(c):
                    return True
                if _only(c, VIEW):
                    todo.extend(o for o in c.flat_proxy_outs if isinstance(o, TensorProxy))
        return False

    def recomputable(b: BoundSymbol) -> bool:
        if id(b) not in verdict:
            verdict[id(b)] = (id(b) in forward and claimed(b) and len(b.flat_proxy_outs) == 1
                              and _only(b, _RECOMPUTABLE))
        return verdict[id(b)]

    held: set[str] = set()  # what the recomputations chosen so far save instead
    candidates = {n for n, t in saved.items() if n not in inputs and read_by_no_fusion(t)}
    passed_as = {}  # a saved conversion of a value no pointwise op makes -> that value
    for n in saved.keys() - candidates:
        src = _converted_from(saved[n], producer)
        if src is not None and ((p := producer.get(src, None)) is None or not recomputable(p)):
            passed_as[n] = src.name

    def free(t: TensorProxy) -> bool:
        """Held anyway: an input, what a chosen recomputation saves, a saved value no
        pointwise op makes, or what a saved conversion converts (thunder's
        rematerialization saves that in its place)."""
        if t.name in inputs or t.name in held or t.name in passed_as.values():
            return True
        p = producer.get(t, None)
        return t.name in saved and (p is None or not recomputable(p))

    # which saved tensors to make again: until no more is cheaper, a walk's stops (saved
    # from there on) free for the walks after it
    chosen: dict[str, list[BoundSymbol]] = {}
    changed = True
    while changed:
        changed = False
        for name in sorted(candidates - chosen.keys()):
            t = saved[name]
            size = _bytes(t)
            if size is None:
                continue
            walked = _walk_back(t, lambda p: producer.get(p, None), free, recomputable)
            # views alone (K and V expanded to every head) the backward's views between
            # matmuls leave to torch (``hoist_externs.dissolve_runs``): a reshape of an
            # expanded tensor there is a torch copy outside our regions, so they stay saved
            if walked is not None and sum(walked[1].values()) < size and not _views_only(walked[0]):
                chosen[name] = walked[0]
                held.update(walked[1])
                changed = True
    if not chosen:
        return trace
    first_reader: dict[str, BoundSymbol] = {}
    for b in backward:
        for a in b.flat_proxy_args:
            first_reader.setdefault(a.name, b)
    order = {id(b): i for i, b in enumerate(bsyms)}
    out = from_trace(trace)
    fresh: dict[Variable, Proxy] = {}  # what a clone defines, for the clones after it
    cloned: set[int] = set()
    swap: dict[Variable, Proxy] = {}  # a recomputed tensor -> its clone, for the backward
    clones_before: dict[int, list[BoundSymbol]] = {}
    with tracectx(out):
        for name in sorted(chosen, key=lambda n: order[id(first_reader[n])]):
            for b in sorted(chosen[name], key=lambda b: order[id(b)]):
                if id(b) in cloned:
                    continue
                cloned.add(id(b))
                for o in _defined(b):
                    fresh[variableify(o)] = o.replace(name=None)  # a fresh name
                clone = b.from_bsym_swap_proxies(fresh)
                # a backward op: thunder's partition fuses it only with backward ops, and its
                # common-subexpression pass keeps it apart from the forward's
                clone = clone.from_bsym(tags=clone.tags | {BoundSymbolTag.BACKWARD})
                clones_before.setdefault(id(first_reader[name]), []).append(clone)
            swap[variableify(saved[name])] = fresh[variableify(saved[name])]
    result = []
    for b in bsyms:
        if id(b) not in in_backward:
            result.append(b)
            continue
        result.extend(clones_before.get(id(b), ()))
        reads_a_clone = any(variableify(a) in swap for a in b.flat_proxy_args)
        result.append(b.from_bsym_swap_proxies(swap, skip_output=True) if reads_a_clone else b)
    out.bound_symbols = result
    return out


def _asked_once(claimed: Callable[[BoundSymbol], bool]) -> Callable[[BoundSymbol], bool]:
    asked: dict[int, bool] = {}

    def once(b: BoundSymbol) -> bool:
        if id(b) not in asked:
            asked[id(b)] = claimed(b)
        return asked[id(b)]

    return once


def _defined(b: BoundSymbol) -> list[Proxy]:
    """Every proxy ``b`` and the ops inside it define, its inputs left out."""
    args = {a.name for a in b.flat_proxy_args}
    found: dict[str, Proxy] = {}

    def visit(s: BoundSymbol) -> None:
        for o in s.flat_proxy_outs:
            if o.name not in args:
                found.setdefault(o.name, o)
        for sub in s.subsymbols:
            visit(sub)

    visit(b)
    return list(found.values())
