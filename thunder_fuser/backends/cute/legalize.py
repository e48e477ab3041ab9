"""Legalization: a segment's lowered program rewritten until every launch of it has a layout.

Lowering (``lower/expr.py``) makes one program per segment. Laying a program out over
threads (``tiling/geometry.py``) may find that no layout runs it as it is, and says which
rewrite would: its rows apart from its sums per column (``NeedsColumnsApart``), the dims of
a merge walked apart (``NeedsUnmerge``), two programs split at its reductions
(``NeedsSplit``), a reduction in two stages (``NeedsStages``), operands copied into the
rows' order first (``NeedsTranspose``). ``legalize`` applies each verdict's rewrite and lays
out the programs it makes, in order, until each has a layout: those are the segment's
launches (``Part``). A program no rewrite helps raises ``Unsupported``; the segment then
runs on the reference backend (``runtime/plan.py`` records why).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from thunder_fuser.backends.cute.lower.expr import (
    Program,
    columns_apart,
    reduce_in_stages,
    split_at_reductions,
    transpose_first,
    unmerged,
)
from thunder_fuser.backends.cute.tiling.geometry import (
    Needs,
    NeedsColumnsApart,
    NeedsSplit,
    NeedsStages,
    NeedsTranspose,
    NeedsUnmerge,
)
from thunder_fuser.backends.cute.tiling.operands import Geometry
from thunder_fuser.backends.cute.unsupported import Unsupported


class Part:
    """One program of a segment: one launch, its layout and what a call allocates for it."""

    def __init__(self, prog: Program, transposed_copy: bool = False, first_stage: tuple = ()):
        self.prog = prog
        self.transposed_copy = transposed_copy  # copies operands into a reduction's row order (transpose_first)
        self.first_stage = first_stage  # (inner dims, other dims) of a reduction in stages (reduce_in_stages)
        self.geo: Geometry | None = None
        self.fn = None
        self.allocs: list = []  # per store: (shape, strides, dtype) to allocate, or None (a write)
        self.base_refs: list = []  # per geometry base: (True, store index) or (False, value id)
        self.store_recipe: list = []  # per store: (value id, allocation or None), read per call
        self.checks: tuple = ()  # the geometry's alignment checks of bases this call does not allocate
        self.workspace: tuple | None = None  # column reductions, split rows, sums per column: (splits, width) of
        #                                      the fp32 partials
        self.per_split = 0  # rows per split of a column reduction, vectors per split of a split row

    def extra_args(self, device) -> tuple:
        if self.workspace is None:
            return ()
        return (torch.empty(self.workspace, dtype=torch.float32, device=device), self.per_split)


@dataclass
class Rewrite:
    """What a verdict's rewrite makes: the parts run in place of the program, in order, and
    the dim order of each temporary they pass between them (by value id)."""

    parts: list
    orders: dict = field(default_factory=dict)


@dataclass
class Legal:
    """A segment's legal launches, and why its sums per column run apart from its rows
    (``""`` where they do not)."""

    parts: list
    columns_apart: str = ""


def rewrite(prog: Program, verdict: Needs, copies: set) -> Rewrite:
    """The rewrite of ``prog`` that ``verdict`` names. ``copies``: the temporaries of the
    segment's ``transpose_first`` rewrites so far (a copy that needs another is refused)."""
    if isinstance(verdict, NeedsColumnsApart):
        return Rewrite([Part(p) for p in columns_apart(prog)])
    if isinstance(verdict, NeedsUnmerge):
        one = unmerged(prog, verdict.loads)
        if one is None:
            raise Unsupported(str(verdict)) from verdict
        return Rewrite([Part(one)])
    if isinstance(verdict, NeedsSplit):
        return Rewrite([Part(p) for p in split_at_reductions(prog)])
    if isinstance(verdict, NeedsStages):
        progs, temps = reduce_in_stages(prog, verdict.inner)
        first = Part(progs[0], first_stage=(verdict.inner, progs[1].reduced))
        return Rewrite([first] + [Part(p) for p in progs[1:]], {id(t): verdict.order for t in temps})
    if isinstance(verdict, NeedsTranspose):
        if any(id(ld.source) in copies for ld in verdict.loads):  # a copy that came out strided too
            raise Unsupported(f"{verdict}, after a copy into the rows' order") from verdict
        progs, temps = transpose_first(prog, verdict.loads)
        copies.update(id(t) for t in temps)
        first = Part(progs[0], transposed_copy=True)
        return Rewrite([first] + [Part(p) for p in progs[1:]], {id(t): verdict.order for t in temps})
    raise Unsupported(f"no rewrite for {type(verdict).__name__}: {verdict}")


def legalize(parts: list, place) -> Legal:
    """``parts`` (a segment's lowered programs), each laid out by ``place(part, orders)``
    (``orders``: the dim order of each temporary the rewrites so far made, by value id),
    which returns ``None`` once ``part`` has a layout or the ``Needs`` verdict it met; a
    verdict's rewrite takes the part's place and its parts are laid out in turn."""
    pending, done = list(parts), []
    orders: dict = {}
    copies: set = set()
    why_apart = ""
    while pending:
        part = pending.pop(0)
        verdict = place(part, orders)
        if verdict is None:
            done.append(part)
            continue
        if isinstance(verdict, NeedsColumnsApart):
            why_apart = str(verdict)
        r = rewrite(part.prog, verdict, copies)
        orders.update(r.orders)
        pending[:0] = r.parts
    return Legal(done, why_apart)
