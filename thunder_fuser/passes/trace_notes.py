"""Comment lines our rules put in a trace (``rules.cross_entropy.LOSS_NOTE``: why a loss
reads its logits again) kept beside the region they speak of.

A note is a bound symbol with no inputs and no outputs, kept through DCE by its tag. Left
where the rule emitted it, it would sit between ops the fusion pass joins and cut their
region in two (one more region call per step, for a comment); so the pass lifts the notes
out, fuses, and puts each back right before the fusion (or op) that holds the bound symbol
that followed it.
"""

from __future__ import annotations

from thunder.core.symbol import BoundSymbol

from thunder_fuser.rules.cross_entropy import LOSS_NOTE


def lift_notes(bsyms: list[BoundSymbol]) -> tuple[list[BoundSymbol], dict[int, list[BoundSymbol]]]:
    """(the bound symbols without notes, id of the one each note preceded -> its notes)."""
    rest: list[BoundSymbol] = []
    anchored: dict[int, list[BoundSymbol]] = {}
    waiting: list[BoundSymbol] = []
    for b in bsyms:
        if b.sym.id == LOSS_NOTE:
            waiting.append(b)
            continue
        if waiting:
            anchored[id(b)], waiting = waiting, []
        rest.append(b)
    if waiting:  # nothing follows them: they stay last
        anchored[-1] = waiting
    return rest, anchored


def place_notes(groups: list[tuple[BoundSymbol, list[BoundSymbol]]], anchored: dict) -> list[BoundSymbol]:
    """The fused trace's bound symbols, from (fused symbol, the bound symbols it holds), each
    note before the first fused symbol holding its anchor."""
    out: list[BoundSymbol] = []
    for fused, members in groups:
        for b in members:
            out.extend(anchored.get(id(b), ()))
        out.append(fused)
    out.extend(anchored.get(-1, ()))
    return out
