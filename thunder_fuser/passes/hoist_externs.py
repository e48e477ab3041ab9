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

import math
from collections.abc import Callable

from thunder.core import prims
from thunder.core.prims import OpTags
from thunder.core.proxies import Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol

from thunder_fuser.copy_prims import COPY_TO_OUT_ID
from thunder_fuser.ir.from_thunder import prim_names
from thunder_fuser.ir.ops import POINTWISE, REDUCTION, RESIZE, VIEW

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
# views after which a reshape may need a copy (``_views_inputs_for_others``)
_REORDERING_VIEWS = frozenset({"transpose", "broadcast_in_dim"})


def _free_view(b: BoundSymbol) -> bool:
    names = prim_names(b)
    return names is not None and names <= set(_FREE_VIEWS)


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


def _climb(out: list[BoundSymbol], reads: set[str], claimed, to_producer: bool) -> tuple[int, bool]:
    """How far up ``out`` an op reading ``reads`` may move (the index to insert it at), and
    whether it passed an unclaimed op on the way. It stops below the op that makes what it
    reads, an op that writes, or an unclaimed op that may not move; and, unless
    ``to_producer``, at the first claimed op above an unclaimed one (the end of the run
    before them, which it joins)."""
    at, passed = len(out), False
    while at > 0 and not (reads & _names(out[at - 1].flat_proxy_outs)):
        prev = out[at - 1]
        if claimed(prev):
            if (passed and not to_producer) or not _passable(prev, claimed):
                break
        elif _movable(prev):
            passed = True
        else:
            break
        at -= 1
    return at, passed


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
        at, passed = _climb(out, _names(b.flat_proxy_args), claimed, to_producer=False)
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


def join_across_externs(bsyms: list[BoundSymbol], claimed: Callable[[BoundSymbol], bool]) -> list[BoundSymbol]:
    """``bsyms`` with each run of claimed ops just after a block of movable unclaimed ops
    moved up before the block, onto the run of claimed ops before it, where the run reads
    none of the block's results: the two runs join where ``hoist_externs`` cannot (the block
    reads the run before). Only a whole run moves (up to the next unclaimed op): a part of
    it would hand the part left behind its results through memory, a region output more;
    and no run whose reductions read what the run before reads or makes
    (``_reduces_what_it_shares``): joined to a run before, a norm's backward came apart in
    more kernels (thunder's rematerialization then passed the norm's sum of squares, not
    its statistics, and its rows were reduced again); nor one that reshapes a transposed
    view of a tensor it does not make (``_views_inputs_for_others``). A backward's
    weight-gradient matmul reads the product the run before makes again
    (``passes/recompute_in_backward.py``), and the SwiGLU backward after the matmul reads
    the same fc1 and fc2: one region, one pass over them, not two. Only claimed ops
    that write nothing move (``_passable``), past ops that write nothing (``_movable``):
    the unclaimed ops keep their order, and what moves up makes its results a little
    earlier, reading only what was already made."""
    out = list(bsyms)
    ours = lambda b: claimed(b) and _passable(b, claimed) and _movable(b)  # noqa: E731
    i = 1
    while i < len(out):
        if not (claimed(out[i - 1]) and not claimed(out[i]) and _movable(out[i])):
            i += 1
            continue
        j = i
        while j < len(out) and not claimed(out[j]) and _movable(out[j]):
            j += 1
        k = j
        while k < len(out) and ours(out[k]):
            k += 1
        made = set().union(*(_names(b.flat_proxy_outs) for b in out[i:j]))
        whole = j < k and (k == len(out) or not claimed(out[k]))
        a = i - 1
        while a > 0 and claimed(out[a - 1]):
            a -= 1
        if (whole and not any(_names(b.flat_proxy_args) & made for b in out[j:k])
                and not _reduces_what_it_shares(out[a:i], out[j:k])
                and not _views_inputs_for_others(out[j:k])):
            out[i:k] = out[j:k] + out[i:j]
            i = k  # past the block, now after the run
        else:
            i = j + 1
    return out


def hoist_reductions(bsyms: list[BoundSymbol], claimed: Callable[[BoundSymbol], bool]) -> list[BoundSymbol]:
    """``bsyms`` with each claimed reduction that only other executors' ops or the return
    read (a bias gradient: the sum over the tokens of a layer's output gradient) moved up
    past the unclaimed ops before it, to right after the claimed op that makes what it
    reads. A backward writes a bias gradient's sum after the matmuls that read the same
    gradient, so it sat in the next region (beside a norm's backward) and read its
    ``[tokens, width]`` operand from memory again; moved beside the op that makes it (the
    GELU's backward), the kernel that stores the gradient sums its columns on the way (a
    column kernel stores full-domain values as it walks the rows), as Inductor's
    ``gelu_backward_sum`` does. Only a sum whose result no claimed op reads moves: a norm's
    statistics stay with the rows that read them. And only onto an elementwise op
    (``_elementwise``): beside a cat (RoPE's backward, the QKV bias gradient) no kernel takes
    both, the resize kernel then stored the sum's fp32 upcast for it (H100, pythia-1b's
    layer: RoPE's backward 41 -> 73 µs, and a column sum over fp32). It crosses only ops
    that write nothing (``_passable``, ``_movable``), and what it keeps alive longer is its
    small result (``_reduces``). H100, one layer: pythia-1b's GELU backward and its three
    column sums 89.7 + 57.3 µs -> 98.0 + 28.6 (two sums)."""
    read_by_ours: set[str] = set()
    for b in bsyms:
        if claimed(b):
            read_by_ours |= _names(b.flat_proxy_args)
    out: list[BoundSymbol] = []
    for b in bsyms:
        if not (claimed(b) and _reduces(b) and _passable(b, claimed) and _movable(b)
                and not _names(b.flat_proxy_outs) & read_by_ours):
            out.append(b)
            continue
        reads = _names(b.flat_proxy_args)
        at, passed = _climb(out, reads, claimed, to_producer=True)
        if not (passed and at > 0 and claimed(out[at - 1]) and reads & _names(out[at - 1].flat_proxy_outs)
                and _elementwise(out[at - 1])):
            at = len(out)  # its operand is not made by a pointwise op it could join
        out.insert(at, b)
    return out


def _elementwise(b: BoundSymbol) -> bool:
    """An op of elementwise prims, or a view that keeps its operand's shape: a sum of its
    result is over its kernel's domain and joins it. Behind a view that reshapes (the tokens
    flattened) the sum would be a segment of its own, handed a value through memory."""
    names = prim_names(b)
    if names is None or not names <= set(POINTWISE) | set(VIEW):
        return False
    shapes = {tuple(p.shape) for p in (*b.flat_proxy_args, *b.flat_proxy_outs) if isinstance(p, TensorProxy)}
    return not names & set(VIEW) or len(shapes) == 1


def _reduces_any(b: BoundSymbol) -> bool:
    names = prim_names(b)
    return names is None or bool(names & set(REDUCTION))


def _views_inputs_for_others(run: list[BoundSymbol]) -> bool:
    """Whether ``run`` reshapes a transposed or broadcast view of a tensor it does not make
    (a key's gradient from attention's backward, transposed and reshaped for its
    projection's matmuls): where the run stands ``dissolve_runs`` leaves such views to
    torch, which copies; joined to a region they would be its outputs, at strides that only
    a copy makes, and the region would fall back to the reference backend."""
    made: set[str] = set()
    moved: set[str] = set()  # views of what the run does not make, transposed or broadcast
    for b in run:
        args, outs = _names(b.flat_proxy_args), _names(b.flat_proxy_outs)
        if not _free_view(b) or args & made:
            made |= outs
            continue
        names = prim_names(b) or set()
        if args & moved and "reshape" in names:
            return True
        if args & moved or names & _REORDERING_VIEWS:
            moved |= outs
    return False


def _reduces_what_it_shares(before: list[BoundSymbol], run: list[BoundSymbol]) -> bool:
    """Whether a reduction of ``run`` reads (through ``run``'s own ops) what the run
    ``before`` reads or makes: joined, thunder's rematerialization may then pass the two
    regions' shared values in another form (a norm's backward got the sum of squares, not
    its statistics, and reduced its rows again). A reduction over values of its own (a bias
    gradient's sum over the tokens beside a GELU's backward) joins: the pointwise ops share
    the pass over what both runs read."""
    shared = set().union(*(_names(b.flat_proxy_args) | _names(b.flat_proxy_outs) for b in before))
    for b in run:
        if _names(b.flat_proxy_args) & shared:
            if _reduces_any(b):
                return True
            shared |= _names(b.flat_proxy_outs)
    return False


def _reduces(b: BoundSymbol) -> bool:
    """A reduction whose results are smaller than its largest operand (a bias gradient's sum
    over the tokens): moved earlier, what it keeps alive longer is small."""
    prims_of = prim_names(b)
    if not prims_of or not prims_of & set(REDUCTION):
        return False
    size = lambda ps: max((math.prod(p.shape) for p in ps if isinstance(p, TensorProxy)), default=0)  # noqa: E731
    return size(b.flat_proxy_outs) < size(b.flat_proxy_args)


def _runs(bsyms: list[BoundSymbol], claimed) -> list[tuple[int, int]]:
    """``(start, stop)`` of each maximal run of claimed ops."""
    runs, start = [], None
    for i, b in enumerate(bsyms):
        if claimed(b) and start is None:
            start = i
        elif not claimed(b) and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(bsyms)))
    return runs


def _split_run(run, before, after, claimed) -> tuple[list, list, list] | None:
    """``run``'s ops as (up, left, down), each in order, or None if some op can go nowhere:
    - left: the views whose results the unclaimed ops ``after`` read (a matmul's operands),
      and the views they view: they stay where they are, run by torch as views (as a region
      of views only ran them), so no region has to store a view of its own result;
    - up: the reductions (and the views only they read) that read nothing ``before`` makes,
      into the run before: what they keep alive longer is small;
    - down: every other op, into the run after: nothing ``after`` reads it."""
    if not all(_passable(b, claimed) and _movable(b) for b in run):
        return None
    needed = set().union(*(_names(b.flat_proxy_args) for b in after))
    left: set[int] = set()
    for b in reversed(run):
        if _names(b.flat_proxy_outs) & needed:
            if not _free_view(b):
                return None
            left.add(id(b))
            needed |= _names(b.flat_proxy_args)
    blocked = set().union(*(_names(b.flat_proxy_outs) for b in before))  # names an up op may not read
    up_ok: set[int] = set()
    for b in run:
        if id(b) not in left and (_free_view(b) or _reduces(b)) and not (_names(b.flat_proxy_args) & blocked):
            up_ok.add(id(b))
        else:
            blocked |= _names(b.flat_proxy_outs)
    up: set[int] = set()
    wanted: set[str] = set()  # what the reductions going up read
    for b in reversed(run):
        if id(b) in up_ok and (_reduces(b) or _names(b.flat_proxy_outs) & wanted):
            up.add(id(b))
            wanted |= _names(b.flat_proxy_args)
    pick = lambda ids: [b for b in run if id(b) in ids]  # noqa: E731
    return pick(up), pick(left), [b for b in run if id(b) not in up and id(b) not in left]


def dissolve_runs(bsyms: list[BoundSymbol], claimed: Callable[[BoundSymbol], bool]) -> tuple[list[BoundSymbol], set[int]]:
    """``bsyms`` without the runs of claimed ops that need not sit between the unclaimed
    ops around them, and the ids of the ops released to torch. Each op of such a run moves
    up into the run before, stays as a view torch takes, or moves down into the run after
    (``_split_run``), and the region it would have made is gone. transformers' attention
    backward sums each projection's bias gradient, views the next projection's output
    gradient for its matmuls and views the matmuls' results to add them, all between the
    input gradients' matmuls: two regions a layer, each a call (and a launch for the sums),
    whose ops belong to the regions around them or need none. Only pure ops move, only
    across pure unclaimed ops (as above); a run that the runs around it cannot take stays."""
    out, released = list(bsyms), set()
    ours = lambda b: claimed(b) and id(b) not in released  # noqa: E731
    i = 1
    while True:
        runs = _runs(out, ours)
        if i >= len(runs) - 1:
            return out, released
        (_, prev_stop), (start, stop), (next_start, _) = runs[i - 1], runs[i], runs[i + 1]
        before, run, after = out[prev_stop:start], out[start:stop], out[stop:next_start]
        split = None
        if all(_movable(b) for b in before + after):
            split = _split_run(run, before, after, ours)
        if split is None:
            i += 1
            continue
        up, left, down = split
        released |= {id(b) for b in left}
        out[prev_stop:next_start] = up + before + left + after + down
        # the run before has grown; the next run is now the one after it


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
        prims_of = prim_names(b)
        if prims_of is None:
            continue
        if "stride_order" in prims_of and _names(b.flat_proxy_args) & resized:
            kept.add(id(b))
        elif set(RESIZE).intersection(prims_of):
            resized |= _names(b.flat_proxy_outs)
    return frozenset(kept)
