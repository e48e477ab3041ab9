"""Ops we do not run moved up past region ops they do not read, so regions join.

thunder's consecutive partition makes one region of each run of ops we claim, and an op
we leave to another executor (a matmul, the attention, an embedding) ends the run. A
program often writes such an op between two runs that do not depend on it: transformers'
attention projects q, views it, projects k, views it, projects v; its MLP applies SiLU to
the gate's projection, then projects up, then multiplies. Each view or SiLU becomes a
region of its own: one more call, guard and launch per layer and step, which is what a
batch-1 decode step and pythia's training step are bound by. Hoisting each such op up to
right after the last op it reads (``linear k`` before q's views, ``linear up`` before the
SiLU) leaves the claimed ops adjacent, and the partition makes one region of them.

What moves, and across what, is kept safe by construction:
- only ops with a tensor result and no in-place effect move (no ``IN_PLACE`` or
  ``DONT_DCE`` tag, no trailing ``_`` in their name, not ``return``); every other op is a
  fixed point nothing crosses;
- they move only past ops we claim that write nothing (no ``copy_``/``copy_to_out_``), so
  a read is never moved across a write of the same memory;
- ops that stay with other executors keep their order among themselves (random draws,
  collectives and host syncs are issued as the program wrote them).
Moving an op up only makes its result live a little earlier; what it reads is read where
it was already live.
"""

from __future__ import annotations

from collections.abc import Callable

from thunder.core import prims
from thunder.core.prims import OpTags
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol

from thunder_fuser.copy_prims import COPY_TO_OUT_ID
from thunder_fuser.ir.from_thunder import flatten_to_supported
from thunder_fuser.ir.ops import RESIZE, VIEW

_WRITES = (prims.PrimIDs.COPY_, COPY_TO_OUT_ID)
_FIXED_TAGS = (OpTags.IN_PLACE, OpTags.DONT_DCE)


def _movable(b: BoundSymbol) -> bool:
    if b.sym.id == prims.PrimIDs.RETURN or b.sym.name.endswith("_") or not b.flat_proxy_outs:
        return False
    if any(t in _FIXED_TAGS for t in (b.tags or ())) or any(t in _FIXED_TAGS for t in (b.sym.tags or ())):
        return False
    return all(isinstance(o, TensorProxy) for o in b.flat_proxy_outs)


def _passable(b: BoundSymbol, claimed: Callable[[BoundSymbol], bool]) -> bool:
    """A claimed op an unclaimed one may move above: it writes no memory."""
    if b.sym.id in _WRITES or not claimed(b):
        return False
    return not any(s.sym.id in _WRITES for s in b.subsymbols)


def _names(proxies) -> set[str]:
    return {p.name for p in proxies if isinstance(p, Proxy)}


# views that re-describe their operand (no copy, no allocation): moving one earlier keeps
# nothing alive that was not already (``stride_order`` may copy, so it stays)
_FREE_VIEWS = frozenset(VIEW) - {"stride_order"}


def _free_view(b: BoundSymbol) -> bool:
    try:
        return all(f.sym.name in _FREE_VIEWS for f in flatten_to_supported(b))
    except NotImplementedError:
        return False


def _views_for_others(bsyms: list[BoundSymbol], claimed) -> set[int]:
    """Ids of the claimed views whose results only ops of other executors read (a matmul's
    operands), or views like them: moved into a region they become its outputs, never
    operands a kernel must read through (a reshape of an expanded k that only a copy makes
    would then have sent the kernel to the reference backend)."""
    readers: dict[str, list[BoundSymbol]] = {}
    for b in bsyms:
        for name in _names(b.flat_proxy_args):
            readers.setdefault(name, []).append(b)
    found: set[int] = set()
    for b in reversed(bsyms):
        if claimed(b) and _free_view(b) and all(
                not claimed(r) or id(r) in found for o in _names(b.flat_proxy_outs) for r in readers.get(o, ())):
            found.add(id(b))
    return found


def hoist_views(bsyms: list[BoundSymbol], claimed: Callable[[BoundSymbol], bool]) -> list[BoundSymbol]:
    """``bsyms`` with each claimed view moved up past the movable unclaimed ops before it
    (and the claimed writing-free ops between), where it reads none of their results, to
    the end of the run of claimed ops before them. A backward step computes a weight
    gradient's operands (views of the output gradient and of a saved input) after the
    input gradient's matmul only because the program wrote them there; moved up, they join
    the region before it, and the weight gradient's matmul can then be hoisted out of the
    next region's way (``hoist_externs``)."""
    movable = _views_for_others(bsyms, claimed)
    out: list[BoundSymbol] = []
    for b in bsyms:
        if id(b) not in movable:
            out.append(b)
            continue
        reads = _names(b.flat_proxy_args)
        at, passed = len(out), False
        while at > 0 and not (reads & _names(out[at - 1].flat_proxy_outs)):
            prev = out[at - 1]
            if claimed(prev):
                if passed or not _passable(prev, claimed):
                    break  # the run before the ops passed: join it here
            elif _movable(prev):
                passed = True
            else:
                break
            at -= 1
        if not (passed and at > 0 and claimed(out[at - 1])):
            at = len(out)  # no op of another executor passed, or no run to join
        out.insert(at, b)
    return out


def hoist_externs(bsyms: list[BoundSymbol], claimed: Callable[[BoundSymbol], bool]) -> list[BoundSymbol]:
    """``bsyms`` with each movable unclaimed op moved up past the whole run of claimed,
    writing-free ops just before it, where it reads none of their results (module
    docstring). An op that reads one stays: moved into the run it would cut that region in
    two."""
    out: list[BoundSymbol] = []
    for b in bsyms:
        if claimed(b) or not _movable(b):
            out.append(b)
            continue
        reads = _names(b.flat_proxy_args)
        at = len(out)
        while at > 0 and _passable(out[at - 1], claimed) and not (reads & _names(out[at - 1].flat_proxy_outs)):
            at -= 1
        if at > 0 and claimed(out[at - 1]):
            at = len(out)  # into the middle of a run: one region cut in two, nothing joined
        out.insert(at, b)
    return out


def contiguous_of_resizes(bsyms: list[BoundSymbol]) -> frozenset[int]:
    """Ids of the ``x.contiguous()`` calls (``stride_order``) of a pad, cat or slice result,
    which the fusion pass leaves to torch: the program makes such a result dense for a view
    (transformers' shifted labels, ``pad(labels)[..., 1:].contiguous().view(-1)``), which a
    kernel could only read through by a copy, so the region ends there as it did before
    ``stride_order`` was claimed, and the view is of a region input again (one value per row
    of the loss's kernel)."""
    resized: set[str] = set()
    kept: set[int] = set()
    for b in bsyms:
        try:
            prims_of = [f.sym.name for f in flatten_to_supported(b)]
        except NotImplementedError:
            continue
        if "stride_order" in prims_of and _names(b.flat_proxy_args) & resized:
            kept.add(id(b))
        elif set(RESIZE).intersection(prims_of):
            resized |= _names(b.flat_proxy_outs)
    return frozenset(kept)
