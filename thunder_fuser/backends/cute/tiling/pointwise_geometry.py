"""Layout math of the pointwise families (``pointwise.py``, ``staged.py``): the outer mode
a thread walks several rows of, loading the operands broadcast along it once, and the
operands staged through shared-memory tiles (a tiled transpose) with the tile's shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thunder_fuser.backends.cute.lower.expr import Program
    from thunder_fuser.backends.cute.tiling.operands import Geometry

REUSE_ROWS = 2  # rows a pointwise thread walks along a broadcast mode: 2 measured 3-6% above 1 and 4
#                (RoPE, gelu + bias; scripts/pointwise_probe.py, H100)
# A pointwise operand whose fastest dim is not the output's (x + y.t()) is read element by
# element along N, each element a sector of its own. Where it is contiguous along an outer
# mode instead, a block stages a tile of STAGE_ROWS rows along that mode by STAGE_ROW_BYTES
# of the narrowest vector operand along N through shared memory: read coalesced along its
# own fastest dim, then read by each thread along N (``staged.build_pointwise_staged``,
# Inductor's tiled transpose). A mode shorter than STAGE_MIN_ROWS keeps the gather: most
# of a tile would idle.
STAGE_ROWS = 32
STAGE_ROW_BYTES = 128  # a tile row: one 128-byte line of the output (or of the narrowest vector operand)
STAGE_MIN_ROWS = 16
STAGE_ITEMSIZES = (2, 4)  # the shared tile's padding keeps its reads free of bank conflicts for these


def broadcast_reuse(geo: Geometry) -> tuple:
    """(mode, rows): the outer mode (innermost-first index) along which the most loaded
    operands are broadcast, walked ``rows`` at a time by each thread, so that those operands
    are read once for all the rows (RoPE's cos and sin over the heads, a bias over the
    tokens): fewer loads and less index arithmetic per element written. () when no operand
    is broadcast along an outer mode."""
    best, best_count = None, 0
    for r, extent in enumerate(reversed(geo.outer)):
        count = sum(1 for o in geo.operands if not o.is_store and o.stride[r] == 0)
        if extent > 1 and count > best_count:
            best, best_count = r, count
    if best is None or REUSE_ROWS <= 1:
        return ()
    return (best, REUSE_ROWS)


def transpose_stage(prog: Program, geo: Geometry) -> tuple:
    """(mode, slots): the loaded operands to stage through shared memory (see STAGE_ROWS),
    those contiguous along outer mode ``mode`` (innermost-first index) and strided along N;
    the mode that stages the most bytes. () when none is."""
    shifted = {geo.load_slot[id(ld)] for ld in prog.loads if ld.shifts}
    by_mode: dict[int, list[int]] = {}
    for i, o in enumerate(geo.operands):
        if o.is_store or o.inner_mode != "gather" or o.iota is not None or i in shifted:
            continue
        if o.dtype.itemsize not in STAGE_ITEMSIZES:
            continue
        r = next((r for r, s in enumerate(o.stride[:-1]) if s == 1 and o.shape[r] >= STAGE_MIN_ROWS), None)
        if r is not None:
            by_mode.setdefault(r, []).append(i)
    if not by_mode:
        return ()
    r = max(by_mode, key=lambda r: sum(geo.operands[i].dtype.itemsize for i in by_mode[r]))
    return (r, tuple(by_mode[r]))


def stage_tile(geo: Geometry) -> tuple[int, int]:
    """(rows, vectors) of a staged tile: STAGE_ROWS along the staged mode by a line of
    STAGE_ROW_BYTES of the narrowest operand read or written in vectors along N."""
    itemsize = min((o.dtype.itemsize for o in geo.operands if o.inner_mode == "vec"), default=4)
    return STAGE_ROWS, max(1, STAGE_ROW_BYTES // itemsize // geo.vector)
