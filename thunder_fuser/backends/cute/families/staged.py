"""The staged pointwise family: an operand contiguous along an outer mode and strided along
``N`` (x + y.t()) read through shared-memory tiles, as Inductor's tiled transpose does.

A block stages a tile of ``pointwise_geometry.STAGE_ROWS`` rows of such an operand by a
128-byte line, read coalesced along its own fastest dim, then read by each thread along
the output's ``N`` (``pointwise_geometry.stage_tile``); the other operands move as in
``pointwise.py``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from thunder_fuser.backends.cute.dsl.cute_memory import (
    coord_entry,
    load_scalar_if,
    mode_extent,
    operand_views,
    row_coord,
    store_vector,
    with_coord_entry,
)
from thunder_fuser.backends.cute.dsl.cute_values import cute_dtype
from thunder_fuser.backends.cute.families.pointwise import POINTWISE_THREADS, pointwise_pieces
from thunder_fuser.backends.cute.lower.expr import Program
from thunder_fuser.backends.cute.tiling.geometry import Geometry
from thunder_fuser.backends.cute.tiling.pointwise_geometry import stage_tile
from thunder_fuser.backends.cute.kernel_names import named


def build_pointwise_staged(prog: Program, geo: Geometry):
    """A pointwise program whose operands in ``geo.stage`` are contiguous along outer mode
    ``r`` and strided along N (x + y.t()): each block takes a tile of rows along ``r`` by
    vectors along N (``pointwise_geometry.stage_tile``: a 128-byte line of each row). First the block
    copies the staged operands' tiles into shared memory, consecutive threads reading
    consecutive rows (each warp a contiguous run of that operand); then each thread
    computes its vectors as the plain template does, reading the staged operands from the
    tiles along N. A tile row is padded to an odd number of 32-bit words, so both walks are
    free of bank conflicts where the staged operand is as wide as the narrowest vector
    operand (fp32 tiles beside bf16 vectors read with two-way conflicts)."""
    V, T = geo.vector, POINTWISE_THREADS
    TR, TJ = stage_tile(geo)
    TN = TJ * V
    rank = len(geo.outer) + 1
    r, slots = geo.stage
    ops = geo.operands
    ref_slot = geo.store_slot[0]
    _, _, values = pointwise_pieces(prog, geo)
    pitch = {s: TN + 4 // ops[s].dtype.itemsize for s in slots}

    def body(t2s, tvs, N, nvec, tiles_n, tidx, bidx):  # plain Python, traced into the kernel
        smem = cutlass.utils.SmemAllocator()
        tiles = {s: smem.allocate_tensor(cute_dtype(ops[s].dtype), cute.make_layout((TR, TN), stride=(pitch[s], 1)), 16)
                 for s in slots}
        group = bidx // tiles_n
        jt = bidx - group * tiles_n
        coord = row_coord(t2s[ref_slot], group, rank, (r, TR))
        extent = mode_extent(t2s[ref_slot], rank, r)
        first = coord_entry(coord, r) * TR
        # the staged operands' tiles, consecutive threads along r: every load issued before the
        # first store into the tile waits for one
        rr = tidx % TR
        row = with_coord_entry(coord, r, first + rr)
        loaded = []
        for i in range(TR * TN // T):
            nn = (i * T + tidx) // TR
            ok = (first + rr < extent) & (jt * TN + nn < N)
            loaded += [(s, nn, load_scalar_if(t2s[s], row, jt * TN + nn, ok)) for s in slots]
        for s, nn, value in loaded:
            tiles[s][(rr, nn)] = value
        cute.arch.sync_threads()
        pending = []  # the program, a vector at a time; all loads before the stores (see pointwise_pieces)
        for i in range(TR * TJ // T):
            idx = i * T + tidx
            rr = idx // TJ
            jj = idx - rr * TJ
            j = jt * TJ + jj
            row = with_coord_entry(coord, r, first + rr)
            ok = (first + rr < extent) & (j < nvec)
            staged = {s: _tile_vector(tiles[s], rr, jj * V, V) for s in slots}
            pending.append((values(t2s, tvs, row, j, N, ok, {}, staged), row, j, ok))
        for vals, row, j, ok in pending:
            for val, slot in zip(vals, geo.store_slot):
                store_vector(val, ops[slot], t2s[slot], tvs[slot], row, j, V, N, ok)

    @cute.kernel
    def kernel(t2s, tvs, N: cutlass.Int32, nvec: cutlass.Int32, tiles_n: cutlass.Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        body(t2s, tvs, N, nvec, tiles_n, tidx, bidx)

    named(kernel, "staged", [prog])

    @cute.jit
    def launch(ts, stream):
        t2s, tvs, M, N = operand_views(ts, geo, rank, V, ref_slot)
        extent = mode_extent(t2s[ref_slot], rank, r)
        groups = M // extent * ((extent + TR - 1) // TR)
        nvec = (N + V - 1) // V
        tiles_n = (nvec + TJ - 1) // TJ
        kernel(t2s, tvs, N, nvec, tiles_n).launch(grid=[groups * tiles_n, 1, 1], block=[T, 1, 1], stream=stream)

    return launch


def _tile_vector(tile: cute.Tensor, row, n0, V: int):
    """``V`` consecutive elements of a shared-memory tile's row, one access each (the
    padded rows leave them no wider alignment)."""
    frag = cute.make_rmem_tensor((1, V), tile.element_type)
    for k in range(V):
        frag[k] = tile[(row, n0 + k)]
    return frag.load()
