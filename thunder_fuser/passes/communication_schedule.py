"""Where a distributed trace's collectives and their waits go: each collective as early as
its inputs allow, each ``wait`` as late as its first reader allows, so that NCCL moves data
while the GPU computes.

thunder's ``sort_waits`` orders the joint trace so before the fusion passes run, but the
partition into regions then decides the order again. On two H200s the trace fuser_ex ran had
every forward ``wait`` before the first layer (one region read every layer's norm weight) and
every gradient's reduce-scatter after the backward's last matmul: 5% of NCCL's time ran under
compute. The rule runs twice:

- before the partition (``hoist=False``), a ``wait`` and the ops made of its result alone (a
  gathered norm weight's broadcast) move down to their first reader, so the ops we claim
  there join that reader's region and no region waits for another layer's weights;
- after it, a collective (all-gather, reduce-scatter, all-reduce) runs the moment its inputs
  exist, with the ops that exist only to feed it (a weight's gradient matmul and its division
  by the world size, FSDP's bucket packing), which would otherwise wait for their place in
  the trace; waits again go just before their first reader.

Every other op keeps its order (random draws never move); an op that feeds several
collectives (the backward's main path feeds them all) keeps its place, or the backward would
run depth first. Nothing moves where any op writes in place: an async collective reads its
inputs until its wait, and a write the schedule moved past could change what it sends. The
schedule is linear in the trace: readiness is asked once per op and query.
"""

from __future__ import annotations

from thunder.core.prims import OpTags
from thunder.core.symbol import BoundSymbol

from thunder_fuser.passes.rematerialize import writes_in_place

_COLLECTIVES = ("torch_all_gather_prim_impl", "torch_reduce_scatter_prim_impl", "torch_all_reduce_prim_impl")
_WAIT = "torch_wait_prim_impl"


def is_collective(b: BoundSymbol) -> bool:
    return b.sym.name in _COLLECTIVES


def is_wait(b: BoundSymbol) -> bool:
    return b.sym.name == _WAIT


def schedule_communication(bsyms: list[BoundSymbol], hoist: bool = True) -> list[BoundSymbol]:
    """``bsyms`` in the order above; ``bsyms`` itself where it has no collective or writes in
    place. ``hoist=False``: waits and what is made of their results alone move down, nothing
    moves up (before the partition into regions, where a matmul moved up would split a run of
    ops we claim in two)."""
    if not any(is_collective(b) for b in bsyms) or writes_in_place(bsyms):
        return bsyms
    try:
        return _scheduled(bsyms, hoist)
    except RecursionError:  # chains of lazy or feeding ops deeper than Python's stack: keep the order
        return bsyms


def _scheduled(bsyms: list[BoundSymbol], hoist: bool) -> list[BoundSymbol]:
    producer: dict[str, int] = {}
    for i, b in enumerate(bsyms):
        for p in b.flat_proxy_outs:
            producer.setdefault(p.name, i)
    reads = [sorted({producer[p.name] for p in b.flat_proxy_args if producer.get(p.name, i) < i}) for i, b in enumerate(bsyms)]
    readers: list[list[int]] = [[] for _ in bsyms]
    for i, deps in enumerate(reads):
        for d in deps:
            readers[d].append(i)
    # ops that exist only to feed one collective (each reader is it, or another such op of it):
    # they go with it. An op that feeds several (the backward's main path feeds them all) keeps
    # its place, or the schedule would run the backward depth first.
    target: list[int | None] = [None] * len(bsyms)
    for i in range(len(bsyms) - 1, -1, -1):
        b = bsyms[i]
        if is_collective(b):
            target[i] = i
            continue
        if is_wait(b) or not readers[i] or not b.flat_proxy_outs or _random(b):
            continue
        goes_to = {target[r] for r in readers[i]}
        if len(goes_to) == 1 and None not in goes_to:
            target[i] = goes_to.pop()
    early = [hoist and t is not None for t in target]
    # a wait, and what is made from waits' results alone (a gathered weight's broadcast, its
    # cast): each runs just before its first reader, or it would wait for its collective early
    lazy = [False] * len(bsyms)
    for i, b in enumerate(bsyms):
        made_here = all(producer.get(p.name, i) < i for p in b.flat_proxy_args)  # no input of the trace read
        lazy[i] = is_wait(b) or (not is_collective(b) and not _random(b) and bool(reads[i]) and made_here
                                 and all(lazy[d] for d in reads[i]))

    done = [False] * len(bsyms)
    out: list[BoundSymbol] = []

    def ready(i: int) -> bool:
        """Are ``i``'s inputs made, or lazy ops whose inputs are (each asked once a query)?"""
        seen: dict[int, bool] = {}

        def can(d: int) -> bool:
            if done[d]:
                return True
            if not lazy[d]:
                return False
            if d not in seen:
                seen[d] = False  # a lazy op is asked before its inputs are known: not yet
                seen[d] = all(can(e) for e in reads[d])
            return seen[d]

        return all(can(d) for d in reads[i])

    def emit(i: int) -> None:
        for d in reads[i]:
            if not done[d]:  # only a lazy op is left behind (see ``ready``)
                emit(d)
        if done[i]:  # emitting what it reads emitted it (it was their early reader)
            return
        out.append(bsyms[i])
        done[i] = True
        for r in readers[i]:
            if early[r] and not done[r] and ready(r):
                emit(r)

    for i, b in enumerate(bsyms):
        if not done[i] and not lazy[i]:
            emit(i)
    for i, b in enumerate(bsyms):  # lazy ops nothing reads (the trace returns nothing they made)
        if not done[i]:
            out.insert(len(out) - 1 if out and out[-1].sym.name == "python_return" else len(out), b)
            done[i] = True
    return out


def _random(b: BoundSymbol) -> bool:
    """A draw from torch's generator: random ops keep their order among themselves."""
    return any(OpTags.RANDOM_OP in (x.sym.tags or ()) for x in (b, *b.subsymbols))


def future_inputs(bsyms: list[BoundSymbol]) -> dict[str, set[str]]:
    """Per future a collective returns, the names of the tensors it reads: an async collective
    reads them until its ``wait`` (no fusion may write over them before it)."""
    return {p.name: {a.name for a in b.flat_proxy_args if hasattr(a, "name")}
            for b in bsyms if is_collective(b) for p in b.flat_proxy_outs}
