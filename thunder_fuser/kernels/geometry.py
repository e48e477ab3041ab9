"""Where a program's operands live: strides over the domain, dim order, coalescing, vector width.

Computed once per plan from the first call's real tensors (a plan is keyed by the input
strides, and every intermediate's strides follow from them). The result has two halves:

* the *signature*: what the compiled kernel depends on (rank after coalescing, which
  strides are 0 or 1, vector width, row tiling). It goes into the compile key; extents and
  other strides stay symbolic, so one kernel serves every size with that signature.
* the *views*: per operand, the (shape, stride, offset) that presents its tensor to the
  kernel as ``[outer dims innermost-first..., N]``. The kernel's launch function builds
  most views from their base tensors (``BaseMap``); any other is one ``as_strided`` per call.

Dims are ordered by the first stored output's allocation order (so its innermost dim is the
vector dim). A reduction whose reduced dims are innermost in memory is a *row* reduction
(the reduced dims go innermost); one whose kept dims are innermost is a *column* reduction
(the kept dims go innermost, as the vector dim, and the reduced dims outer). Adjacent dims
merge when every operand steps through them as through one dim (the TensorIterator rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from thunder_fuser.backends.reference import REFERENCE_IMPLS
from thunder_fuser.kernels.expr import (Program, Unsupported, column_sums, has_reduce, reads_rows_once,
                                        reductions_in_order)

MAX_VECTOR = 8  # elements per thread per access: 16 bytes of bf16
# A vector is 16 bytes of the narrowest operand, but never more than 16 bytes of the widest
# store (``vector_width``): a warp's store of 32-byte vectors (fp32 results of bf16) moved
# in two 16-byte halves, each writing half of every sector it touched. H100,
# scripts/long_rows_probe.py, ms, vectors of 8 / 4: x.float() * 2 of bf16 [8192, 8192]
# 0.147 / 0.139; softmax fp32 of bf16 [8192, 4096] 0.083 / 0.072; log_softmax fp32 of bf16
# [16384, 4096] 0.151 / 0.139, [65536, 1024] 0.145 / 0.139, [1024, 128256] (looped) 0.427 /
# 0.363; torch.compile 0.139, 0.090, 0.16-0.19, 0.47, 0.39-0.54.
# Wider loads cost nothing (a load's second half hits L1): capped at 16 bytes of the widest
# load too, fp32 inputs of bf16 results (a cast, an RMSNorm, a softmax, a residual add) ran
# within 1%, at the copy bandwidth either way.
VECTOR_BY_STORES = True  # False only to measure vectors of 16 bytes of the narrowest operand
# Threads per row held in registers: the fewest whose vectors fit (``_row_tiling``). Rows
# of a part of a warp (4-16 threads) keep each thread's loads several and the warp's rows
# many: H100, scripts/long_rows_probe.py, softmax of bf16 [262144, 64] 0.071 ms in rows of
# a warp, 0.026 in rows of 4 threads; a ViT's [64, 12, 197, 197] 0.127 -> 0.054 (8
# threads); [65536, 256] and a layer norm of [65536, 512] alike (0.026, 0.050).
ROW_THREADS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
MAX_ROW_VECTORS = 8  # per thread: a persistent row holds at most 8 vectors per value, and
# more than 4 only in blocks of WIDE_ROW_THREADS threads or more, or where they are at most
# ROW_ELEMENTS elements (``_row_tiling``); in blocks of WIDE_ROW_THREADS only where a block
# twice as wide would hold more than PAIRED_BLOCK_ELEMENTS elements per thread: at most
# that many, two blocks of 1024 fit an SM's registers. H100, scripts/long_rows_probe.py, ms:
# - WIDE_ROW_THREADS: softmax of bf16 [8192, 16384] 0.266 in 256 threads of 8 vectors (86
#   registers each), 0.182 in 512 of 4 (63); a log_softmax of the same 0.317 / 0.302; layer
#   and RMS norms of rows of 12-16K alike; 1024 no faster than 512;
# - PAIRED_BLOCK_ELEMENTS: vectors of 4 (fp32 rows, fp32 results of bf16 rows:
#   ``vector_width``) in 512 threads of 8 / 1024 of 4: log_softmax fp32 of bf16 [8192,
#   16384] 0.355 / 0.275 (torch.compile 0.285), softmax fp32 [4096, 16384] 0.203 / 0.184;
#   vectors of 8 in 512 threads of 5 / 1024 of 3 (24 elements): softmax of bf16 [4096,
#   20000] 0.114 / 0.157, layer_norm 0.113 / 0.127;
# - ROW_ELEMENTS: vectors of one element (rows of odd length too short for
#   FLAT_MIN_VECTORS), whose loads are many and small; softmax of bf16 rows, 128 MiB, 4 such
#   vectors per thread at most / 8: n = 33 0.116 / 0.093, 77 0.104 / 0.080 (eager 0.087).
#   fp32 rows in 8 vectors of 4 (32 elements) ran 3-14% slower than in 4 over twice the
#   threads: n = 77, 128, 200, 1024.
WIDE_ROW_THREADS = 512
PAIRED_BLOCK_ELEMENTS = 16
ROW_ELEMENTS = 8
# A row longer than REGISTER_ROW_ELEMENTS loops over global memory once per pass rather
# than staying in registers: a 32000-element row in registers fills half an SM's register
# file, so one block runs per SM and its loads, block reductions and stores do not overlap
# with another's (scripts/long_rows_probe.py, H100: log_softmax of [4096, 32000] bf16 took
# 0.497 ms in registers and 0.335 looping in blocks of 512; a layer norm of [2048, 65536]
# 0.261 and 0.235 in blocks of 1024; rows of 16384 bf16 and 20000 fp32 ran faster in
# registers: 0.182 against 0.187, 0.226 against 0.309). Its passes re-read the row from L2
# while the rows resident on all SMs fit LOOP_L2_BYTES (of the H100's 50 MiB): blocks of
# 256 over 64 KiB rows did not fit and took 0.48 ms.
REGISTER_ROW_ELEMENTS = 20480
# Tried and dropped in session 18: a longer row shared by the blocks of a thread-block
# cluster, each holding its part in registers, their partial reductions exchanged through
# distributed shared memory between cluster barriers (the row read once). It ran slower
# than looping wherever it was measured (H100, scripts/long_rows_probe.py, ms looped /
# cluster): log_softmax of bf16 [1024, 128256] 0.461 / 0.495-0.515 (8 blocks of 256 or 512
# threads), [4096, 32000] 0.324 / 0.370-0.471 (2-8 blocks), logsumexp of [2048, 128256], read
# once either way, 0.237 / 0.381-0.457, odd rows of 50257 0.138 / 0.513; a layer norm of [2048,
# 65536] alone gained (0.226 / 0.217). Each block holds 16K elements or fewer through one
# load, the row's reductions and a cluster barrier each, and those fixed costs per block,
# not the loop's re-read from L2, bound it; a cluster design would need the exchange off
# the critical path (mbarriers, rows pipelined per block).
FLAT_ROWS = True  # ``flat_rows``; False only to measure a row of odd length in vectors of one element
# A row held in registers takes its flat run's vectors (``flat_rows``) from FLAT_MIN_VECTORS
# vectors of row on. Its edge vectors' elements, one per thread, cost a short row more than
# its whole vectors save below that (H100, scripts/long_rows_probe.py, 128 MiB, ms in
# vectors of one element / flat: softmax of bf16 rows of 33 0.093 / 0.071, 77 0.080 /
# 0.059, 101 0.055 either way). An fp32 softmax of bf16 rows of 77 took 0.058 / 0.072 while
# its vectors were 8 elements (two 16-byte stores each; it then took 12 vectors), 0.058 /
# 0.052 in vectors of 4 (``vector_width``).
FLAT_MIN_VECTORS = 3
# A looped row read once (``expr.reads_rows_once``: logsumexp) takes the narrowest block:
# H100, scripts/long_rows_probe.py, logsumexp of bf16 [2048, 128256] 0.235 ms in blocks of
# 1024, 0.202 in 512; 256 and 128 no faster. Measured in session 19 and not kept (ms, H100):
# - the passes alternating direction, each re-read starting on the lines the pass before
#   read last: log_softmax of bf16 [4096, 32000] 0.314 -> 0.350, softmax [2048, 128256]
#   0.427 -> 0.441, layer_norm [2048, 65536] 0.222 -> 0.229 ([1024, 128256] 0.427 -> 0.419);
# - registers capped (``.minnctapersm``) so that the blocks the L2 rule counts are resident
#   (60 registers leave one block of 1024 per SM): ptxas spills in the loop, twice as slow;
# - 8 vectors per loop step (``cute_emit.STREAM_UNROLL`` is 4) in every pass, or in one kind
#   of pass (reductions, the online softmax pass, the last pass): slower or the same on every
#   case but the layer norm, whose last pass gained with 8 (0.223 -> 0.194) where a
#   log_softmax's lost (0.314 -> 0.352 over [4096, 32000]).
# ncu on log_softmax of bf16 [1024, 128256]: 295 MB read from DRAM (262 is x once: the
# re-read hits L2) but DRAM only 51% busy at one block per SM; Inductor's kernel reads x
# twice from DRAM at 76% busy (88% occupancy, 32 registers) and is faster (0.388 / 0.427).
LOOP_THREADS = (512, 1024)
LOOP_L2_BYTES = 40 << 20
# A looped row's last pass streams its stores (st.global.cs: L2 lines evict first), and from
# LOOP_LAST_USE_BYTES of the row's own operands on (a weight every row reads not counted)
# marks its loads of them their last use (ld.global.lu), never a weight's, so that neither evicts from L2
# the rows other blocks have yet to re-read (``cute_emit.CACHE_HINTS``). H100,
# scripts/long_rows_probe.py, ms with no hints / stores / loads / both: log_softmax of bf16
# [1024, 128256] 0.461 / 0.456 / 0.458 / 0.427, softmax bf16 [2048, 128256] 0.523 / 0.519 /
# 0.452 / 0.430, layer_norm bf16 [2048, 65536] 0.232 / 0.234 / 0.224 / 0.229. Shorter rows
# keep plain loads: log_softmax of bf16 [4096, 32000] (64 KiB rows, which L1 may still hold
# for the re-read) took 0.324 with no hints, 0.314 with streamed stores, and 0.334 in an
# earlier call with both.
LOOP_LAST_USE_BYTES = 128 << 10
MAX_THREADS_PER_SM = 2048
REUSE_ROWS = 2  # rows a pointwise thread walks along a broadcast mode: 2 measured 3-6% above 1 and 4
#                (RoPE, gelu + bias; scripts/pointwise_probe.py, H100)
GATHER_ROWS = True  # a row reduction may read an operand strided along its row, element by element
# A row kernel gives each row one block, and one block streams only 65-100 GB/s on an H100
# (scripts/gather_rows_probe.py: x.sum() of 64M fp32 took 2.64 ms as one row, torch 0.095;
# a [4, 4M] bf16 product summed per row 0.25 ms, eager 0.05). A row reduction whose rows
# take at least SPLIT_MIN splits (``row_splits``: one wave of SPLIT_BLOCKS_PER_SM blocks per
# SM over all rows, each thread walking at least SPLIT_MIN_VECTORS vectors) therefore
# splits every row across blocks: each block reduces its stretch of the row into a partial,
# and a second launch combines them, as the column reductions do
# (``cute_emit.build_split_rows``). On the H100 that is up to 66 long rows: 48 rows of 1M
# bf16 took 0.074 ms split and 0.087 as a row kernel, 96 rows of 512K 0.074 and 0.072;
# 128 rows of 256K split 9 ways (a wave and a fraction) took 0.070 against 0.048
# (scripts/split_rows_probe.py). A split row's results exist only after both launches, so
# a program whose full-domain stores use its reductions runs as two (the reductions split,
# then a pointwise program), and one with a reduction inside another's argument (a
# softmax's exp(x - max)) first runs the inner one (``expr.split_at_reductions``).
SPLIT_THREADS = 256
SPLIT_MIN_VECTORS = 8  # vectors per thread and split, at least: the block's reduction is amortized
SPLIT_MIN = 8  # fewer splits than this: a row kernel streams about as fast, in one launch
SPLIT_BLOCKS_PER_SM = 4  # resident blocks per SM the splits of all rows fill, in one wave
COLUMN_THREADS = 256  # a column block: col_vectors column vectors x (256 / col_vectors) row groups
COLUMN_BLOCKS_PER_SM = 8  # the splits of a column reduction fill this many blocks per SM,
COLUMN_VAR_SPLITS_PER_SM = 2  # but a var's make at most this many splits per SM: the second launch
# merges a var's splits one after the other (Chan's merge, a division each), and with few
# columns (a channels-last batch norm's 64-256 channels, one block wide) eight blocks per SM
# meant 1056 splits, whose merges took a quarter of the time. var_mean over (0, 2, 3) of NHWC
# bf16 [64, 256, 56, 56] took 0.070 ms with 1056 splits, 0.053 with 264 (H100,
# scripts/column_probe.py). A sum's splits add cheaply: sum(0) over [262144, 256] bf16 took
# 0.057 ms with 1056 splits and 0.071 with 264.
# A row kernel that also sums per column (a norm backward's weight gradient,
# ``expr.Reduce.across``) walks its rows in one wave of blocks, each thread adding up the vectors of its
# columns in fp32 registers: row_vectors x vector of them per sum, at most
# COLUMN_SUM_REGISTERS in all (more go apart: ``NeedsColumnsApart``). Its grid is one wave,
# a block count fixed before the kernel's registers are known: ACROSS_THREADS_PER_SM threads
# per SM, by the registers its sums hold. An RMSNorm backward over 4096 bf16 (one sum, 32
# registers of it) holds 128 registers per thread and a layer norm's over 1024 (two sums, 64)
# 194 (ptxas, sm_90a): three blocks of 128 fit, then two. More blocks than fit run as a
# second wave: H100, scripts/column_sums_probe.py, ms at 256 / 384 / 512 threads per SM: the
# RMSNorm backward [16384, 4096] bf16 0.175 / 0.166 / 0.189 (torch.compile 0.168, the sums
# apart 0.236); layer norm backwards [32768, 4096] 0.393 / 0.468 / 0.416 (1.02, apart 0.449)
# and [8, 1024, 1024] 0.034 / 0.043 / 0.039 (0.053, apart 0.036). Each block writes one
# partial row into the workspace, which a second launch sums per column.
COLUMN_SUM_REGISTERS = 64
ACROSS_THREADS_PER_SM = {32: 384, 64: 256}  # the registers the sums hold (at most) -> threads per SM
# A pointwise operand whose fastest dim is not the output's (x + y.t()) is read element by
# element along N, each element a sector of its own. Where it is contiguous along an outer
# mode instead, a block stages a tile of STAGE_ROWS rows along that mode by STAGE_ROW_BYTES
# of the narrowest vector operand along N through shared memory: read coalesced along its
# own fastest dim, then read by each thread along N (``cute_emit.build_pointwise_staged``,
# Inductor's tiled transpose). A mode shorter than STAGE_MIN_ROWS keeps the gather: most
# of a tile would idle.
STAGE_ROWS = 32
STAGE_ROW_BYTES = 128  # a tile row: one 128-byte line of the output (or of the narrowest vector operand)
STAGE_MIN_ROWS = 16
STAGE_ITEMSIZES = (2, 4)  # the shared tile's padding keeps its reads free of bank conflicts for these


@dataclass(frozen=True)
class Operand:
    source: int  # index into Geometry.bases
    shape: tuple[int, ...]  # the view passed to the kernel: outer dims innermost-first, then N
    stride: tuple[int, ...]
    offset: int  # elements from the base tensor's own storage offset
    is_store: bool
    dtype: torch.dtype
    # an integer iota the kernel computes rather than loads: (start, step, offset); the
    # value at an element is start + step * (offset + its index in the view)
    iota: tuple[int, int, int] | None = None

    @property
    def inner_mode(self) -> str:
        s = self.stride[-1]
        return "vec" if s == 1 else ("bcast" if s == 0 or self.shape[-1] == 1 else "gather")

    def back_to_back(self, rows: int, n: int) -> bool:
        """Rows of ``n`` elements one after another, ``rows`` of them (one outer mode of
        stride ``n``): a flat run of elements (``flat_rows``)."""
        return self.inner_mode == "vec" and self.iota is None and self.stride == (n, 1) and self.shape == (rows, n)

    @property
    def same_every_row(self) -> bool:
        """Every row reads the same elements (a norm's weight): no outer stride but 0."""
        return not any(self.stride[:-1])


@dataclass
class Geometry:
    operands: list[Operand]
    load_slot: dict[int, int]  # id(Load) -> operand index
    store_slot: list[int]  # per program store -> operand index
    outer: tuple[int, ...]  # coalesced outer extents, outermost first
    n: int  # coalesced innermost extent (the vector dim, or the row)
    vector: int
    tail: bool  # N % vector != 0 (only without outer dims): the last vector is predicated
    row_threads: int = 0
    row_vectors: int = 0  # 0 with row_threads set: the row is too long for registers (looped passes)
    last_use: bool = False  # looped rows: the last pass marks its loads the row's last use (LOOP_LAST_USE_BYTES)
    flat: bool = False  # a row or pointwise kernel taking vectors of its rows back to back (``flat_rows``)
    columns: bool = False  # a column reduction: the reduced dims are the outer ones
    across: bool = False  # a row kernel that also sums per column (``across_splits``)
    split_rows: bool = False  # a row reduction whose rows are split across blocks (``row_splits``)
    splits: tuple = ()  # columns, split rows and sums per column: (splits, rows, vectors or row blocks
    #                     per split), for the launches' workspace of partials (``column_splits``,
    #                     ``row_splits``, ``across_splits``); not compiled in
    col_vectors: int = 0  # column vectors per block (columns only)
    outer_select_dim: int | None = None  # the domain dim of a cat/pad along the outermost outer
    #                                      mode (pieces picked per row); a select along any other
    #                                      dim is along the vector dim
    reuse: tuple = ()  # pointwise: (outer mode, rows) a thread walks along one mode where some operand
    #                    is broadcast, loading that operand once for all its rows
    stage: tuple = ()  # pointwise: (outer mode, operand slots) read through shared-memory tiles, the
    #                    operands contiguous along that mode and strided along N (``_transpose_stage``)
    bases: list = field(default_factory=list)  # the first call's tensors the operands view
    call_views: tuple = ()  # per operand: (base index, None where the base is passed as it is, an int
    #                        where it is passed beside that element offset, else (shape, stride,
    #                        element offset) of its ``as_strided``)
    align_checks: tuple = ()  # per vector operand: (base, byte offset, alignment) checked per call
    # per operand: None, or the BaseMap by which the kernel's launch function builds it from its
    # base tensor (passed as it is, no ``as_strided`` per call; broadcast modes take the extent
    # of operand ``map_ref``'s mode)
    base_maps: tuple = ()
    map_ref: int = 0

    @property
    def outer_select(self) -> bool:
        return self.outer_select_dim is not None

    @property
    def looped(self) -> bool:
        """A row kernel whose rows are too long for registers: each pass re-reads the row."""
        return bool(self.row_threads) and not self.row_vectors and not self.split_rows

    def signature(self) -> tuple:
        ops = tuple(
            (str(o.dtype), o.is_store, o.inner_mode, tuple(s == 0 for s in o.stride[:-1]), o.shape[-1] if o.shape[-1] != self.n else -1,
             o.iota)
            for o in self.operands
        )
        return (
            len(self.outer), ops, self.vector, self.tail, self.row_threads, self.row_vectors, self.col_vectors, self.split_rows,
            self.outer_select and tuple(o.shape[len(self.outer) - 1] for o in self.operands), self.reuse, self.stage,
            self.across, self.last_use, self.flat,
            tuple(m and (m, self.bases[o.source].ndim) for m, o in zip(self.base_maps, self.operands)), self.map_ref,
        )


def _view(base: torch.Tensor, views) -> torch.Tensor:
    t = base
    for node in views:
        args = (t,) + tuple(node.args[1:])
        t = REFERENCE_IMPLS[node.op](*args, **node.kwargs)
        if t.numel() and t.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
            raise Unsupported(f"{node.op} of {views[0].args[0].name} needs a copy at these strides")
    return t


def _domain_view(t: torch.Tensor, domain, reduced, is_row: bool, name: str) -> torch.Tensor:
    if tuple(t.shape) == tuple(domain):
        return t
    if is_row:
        keep = tuple(1 if d in reduced else s for d, s in enumerate(domain))
        try:
            return t.view(keep).expand(domain)
        except RuntimeError:
            pass
    elif t.numel() == _numel(domain):
        try:
            return t.view(domain)
        except RuntimeError:
            pass
    raise Unsupported(f"{name} {tuple(t.shape)} cannot be viewed over the domain {tuple(domain)}")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _by_stride(ref: torch.Tensor) -> list[int]:
    return sorted(range(ref.ndim), key=lambda d: (-ref.stride(d) if ref.shape[d] != 1 else 0, d))


def _innermost(ref: torch.Tensor) -> int | None:
    """The reference operand's fastest dim of more than one element (a broadcast dim has
    no place in memory)."""
    inner = [d for d in _by_stride(ref) if ref.shape[d] > 1 and ref.stride(d) != 0]
    return inner[-1] if inner else None


def _kept_innermost(ref: torch.Tensor, reduced) -> bool:
    """Is the reference operand's fastest dim a kept one?"""
    d = _innermost(ref)
    return d is not None and d not in reduced


def _order(ref: torch.Tensor, reduced, inner_select, outer_select, columns: bool) -> list[int]:
    """Domain dims outermost first: by the reference operand's strides; reduced dims (rows),
    kept dims (columns) or the select dim (cat/pad) that is fastest in memory innermost; a
    select dim that is not goes outermost (the kernel picks pieces by rows)."""
    by_stride = _by_stride(ref)
    if columns:
        inner = [d for d in by_stride if d not in reduced]
    elif reduced:
        inner = [d for d in by_stride if d in reduced]
    else:
        inner = [inner_select] if inner_select is not None else []
    head = [outer_select] if outer_select is not None else []
    return head + [d for d in by_stride if d not in inner and d not in head] + inner


def _select_axes(prog: Program, ref: torch.Tensor, domain) -> tuple[int | None, int | None]:
    """(inner, outer) select dims: a cat/pad dim that is the reference operand's fastest
    runs along the vector dim, another one along the outermost outer mode."""
    sels = prog.select_dims
    fastest = _innermost(ref)
    inner = fastest if fastest in sels else None
    outer = [d for d in sels if d != inner]
    if len(outer) > 1:
        raise Unsupported(f"cat/pad along dims {list(sels)}, neither of them the fastest in memory")
    if outer and domain[outer[0]] == 1:
        raise Unsupported("cat/pad producing a single element along its dim")
    return inner, (outer[0] if outer else None)


class NeedsColumnsApart(Unsupported):
    """A row program with sums per column that the row kernel cannot take: its rows are not
    innermost, split across blocks or too long for registers, or its sums would hold too many
    registers. The sums run as a reduction of their own (``expr.columns_apart``)."""


def build_geometry(prog: Program, env: dict, store_tensors: list[torch.Tensor], iotas: dict | None = None,
                   sm_count: int = 132) -> Geometry:
    """``env`` maps ``id(Value)`` to the segment input tensors; ``store_tensors`` are the
    tensors each store writes (freshly allocated outputs, or the ``out`` of a write);
    ``iotas`` gives ``(start, step)`` of the loaded values a kernel may compute instead;
    ``sm_count`` the GPU's multiprocessors (an H100's without one), for splitting rows."""
    if not prog.across:
        return _build_geometry(prog, env, store_tensors, iotas, sm_count)
    try:
        geo = _build_geometry(prog, env, store_tensors, iotas, sm_count)
    except Unsupported as e:  # any rewrite the rows need, they take apart from the sums
        raise NeedsColumnsApart(f"its rows do not run as one row kernel: {e}") from e
    if geo.columns or geo.split_rows or geo.looped:
        what = "columns" if geo.columns else "split across blocks" if geo.split_rows else "too long for registers"
        raise NeedsColumnsApart(f"its rows are {what}")
    held = geo.row_vectors * geo.vector * len(column_sums(prog))
    if held > COLUMN_SUM_REGISTERS:
        raise NeedsColumnsApart(f"its sums per column would hold {held} fp32 registers per thread "
                                f"(at most {COLUMN_SUM_REGISTERS})")
    geo.across, geo.splits = True, across_splits(geo, sm_count, held)
    return geo


def row_block(geo: Geometry) -> tuple[int, int]:
    """(threads, rows) of a row kernel's block: a block reduction serves one row; rows of a
    warp or less share a block of 128 threads."""
    threads = geo.row_threads if geo.row_threads > 32 else 128
    return threads, threads // geo.row_threads


def across_splits(geo: Geometry, sm_count: int, held: int) -> tuple[int, int]:
    """(blocks, row blocks each walks) for a row kernel whose sums per column hold ``held``
    registers per thread: one wave of ACROSS_THREADS_PER_SM threads per SM, each block one
    partial row of the workspace."""
    threads, rows = row_block(geo)
    row_blocks = -(-_numel(geo.outer) // rows)
    per_sm = next(t for most, t in sorted(ACROSS_THREADS_PER_SM.items()) if held <= most)
    blocks = max(1, min(row_blocks, sm_count * max(1, per_sm // threads)))
    per = -(-row_blocks // blocks)
    return -(-row_blocks // per), per


def _build_geometry(prog: Program, env: dict, store_tensors: list[torch.Tensor], iotas: dict | None,
                    sm_count: int) -> Geometry:
    iotas = iotas or {}
    domain = prog.domain
    if not _numel(domain):
        raise Unsupported("an empty domain (nothing to launch)")
    row_dims = set(prog.reduced)  # the dims a row value is broadcast along in its view
    reduced = row_dims if prog.family == "rows" else set()  # the dims the kernel reduces
    bases: list[torch.Tensor] = []

    def base_index(t: torch.Tensor) -> int:
        for i, b in enumerate(bases):
            if b is t:
                return i
        bases.append(t)
        return len(bases) - 1

    load_view = {}
    for ld in prog.loads:
        base = env[id(ld.source)]
        if not isinstance(base, torch.Tensor):
            raise Unsupported(f"{ld.source.name} is not a tensor")
        v = _view(base, ld.views)
        if ld.shifts:
            shifted = {d for d, _ in ld.shifts}
            others = [d for d in range(len(domain)) if d not in shifted]
            if v.ndim != len(domain) or any(v.shape[d] != domain[d] for d in others):
                raise Unsupported(f"a piece of {ld.source.name} {tuple(v.shape)} does not span the domain {domain}")
        else:
            v = _domain_view(v, domain, row_dims, ld.row, ld.source.name)
        load_view[id(ld)] = (v, base_index(base))
    store_views = []
    for st, t in zip(prog.stores, store_tensors):
        if st.across:  # one value per column: broadcast along the across dims
            v = _domain_view(t, domain, set(prog.across), True, st.target.name)
        else:
            v = _domain_view(t, domain, row_dims, st.is_row, st.target.name)
        store_views.append((v, base_index(t)))

    full_stores = [v for (v, _), st in zip(store_views, prog.stores) if not st.is_row and not st.across]
    full_loads = [load_view[id(ld)][0] for ld in prog.loads if not ld.row]
    ref = full_stores[0] if full_stores else (full_loads or [next(iter(load_view.values()))[0]])[0]
    if ref.ndim != len(domain):
        ref = store_views[0][0]
    columns = prog.family == "rows" and _kept_innermost(ref, reduced)
    if columns:
        _check_two_launch_program(prog, "a column reduction")
    inner_sel, outer_sel = _select_axes(prog, ref, domain)
    sels = set(prog.select_dims)
    order = _order(ref, reduced, inner_sel, outer_sel, columns)
    if columns:
        fixed_inner = len(reduced)
    else:  # a forced innermost run: the reduced dims, or the inner select dim
        fixed_inner = len(order) - (len(reduced) if reduced else (1 if inner_sel is not None else 0))

    all_views = [v for v, _ in load_view.values()] + [v for v, _ in store_views]
    # drop size-1 dims, then merge neighbours every operand walks through as one dim
    groups: list[list[int]] = []
    for pos, d in enumerate(order):
        if domain[d] == 1:
            continue
        boundary = pos == fixed_inner or d in sels
        if groups and not boundary and groups[-1][-1] not in sels:
            a = groups[-1][-1]
            if all(v.stride(a) == v.stride(d) * v.shape[d] for v in all_views):
                groups[-1].append(d)
                continue
        groups.append([d])
    if not groups:
        groups = [[order[-1]]] if order else []
    if columns:
        kept_groups = [g for g in groups if g[0] not in reduced]
        if len(kept_groups) != 1:
            raise Unsupported("the kept dims of a column reduction are not one contiguous run for every operand")
    elif reduced:
        inner_groups = [g for g in groups if g[0] in reduced]
        if len(inner_groups) != 1:
            if prog.family == "rows" and groups and groups[-1][0] in reduced:
                _check_two_launch_program(prog, f"the reduced dims {sorted(reduced)} in runs apart")
                inner = tuple(sorted(set(groups[-1]) | {d for d in reduced if domain[d] == 1}))
                kept = [d for d in order if d not in reduced]
                raise NeedsStages(f"the reduced dims {sorted(reduced)} are runs apart in memory", inner,
                                  tuple(kept + [d for d in order if d in reduced and d not in inner] + list(inner)))
            raise Unsupported(f"the reduced dims {sorted(reduced)} are not one contiguous run for every operand")
        if groups[-1] is not inner_groups[0]:
            raise Unsupported("the reduced dims are not innermost")
    outer_groups, inner_group = groups[:-1] if groups else [], groups[-1] if groups else []

    def coalesce(v: torch.Tensor):
        shape, stride = [], []
        for g in reversed(outer_groups):  # innermost-first for CuTe's colexicographic order
            shape.append(_numel(v.shape[d] for d in g))
            stride.append(v.stride(g[-1]))
        if inner_group:
            shape.append(_numel(v.shape[d] for d in inner_group))
            stride.append(v.stride(inner_group[-1]))
        else:
            shape.append(1)
            stride.append(1)
        return tuple(shape), tuple(stride)

    operands: list[Operand] = []
    load_slot: dict[int, int] = {}

    def add(v: torch.Tensor, is_store: bool, bidx: int, iota=None) -> int:
        shape, stride = coalesce(v)
        off = v.storage_offset() - bases[bidx].storage_offset()
        op = Operand(bidx, shape, stride, off, is_store, v.dtype, iota and iota + (off,))
        if not is_store:
            for i, o in enumerate(operands):
                if o == op:
                    return i
        operands.append(op)
        return len(operands) - 1

    for ld in prog.loads:
        v, b = load_view[id(ld)]
        load_slot[id(ld)] = add(v, False, b, iotas.get(id(ld.source)))
    store_slot = [add(v, True, b) for v, b in store_views]
    outer = tuple(_numel(domain[d] for d in g) for g in outer_groups)
    n = _numel(domain[d] for d in inner_group) if inner_group else 1

    if not GATHER_ROWS and prog.family == "rows" and not columns and any(
        o.inner_mode == "gather" and not o.is_store for o in operands
    ):
        raise Unsupported("a reduction over dims that are innermost for some operands and not for others")
    vector = widest = vector_width(operands)
    inner_bounds = _select_bounds(prog, inner_sel)  # pieces along the vector dim must hold whole vectors
    while vector > 1 and not _vector_fits(vector, operands, bases, n, bool(outer) or prog.family == "rows", inner_bounds):
        vector //= 2
    tail = n % vector != 0
    geo = Geometry(
        operands, load_slot, store_slot, outer, n, vector, tail, bases=bases, columns=columns,
        outer_select_dim=outer_sel,
    )
    _call_recipe(geo)
    if prog.family == "rows" and not columns:
        _check_rows_read_in_vectors(prog, geo, order)
    if columns:
        geo.col_vectors = min(32, 1 << max(0, (-(-n // vector) - 1).bit_length()))
        geo.splits = column_splits(geo, sm_count, any(e.op == "var" for e in reductions_in_order(prog)))
    elif prog.family == "rows" and _splits_rows(prog, geo, sm_count):
        geo.split_rows, geo.row_threads = True, SPLIT_THREADS
    elif prog.family == "rows":
        _row_tiling(geo, sm_count, reads_rows_once(prog))
    pointwise = prog.family != "rows" and outer_sel is None
    rows = bool(geo.row_threads) and not geo.split_rows and not prog.across  # looped or in registers
    if (rows or (pointwise and not prog.select_dims)) and flat_rows(geo, widest, pointwise):
        geo.vector, geo.flat = widest, True
        if rows:  # wider vectors: fewer per thread, and a row looped for its narrow ones may fit registers
            _row_tiling(geo, sm_count, reads_rows_once(prog))
        _call_recipe(geo)  # the pointer checks of the wider vector
    elif pointwise:
        geo.stage = _transpose_stage(prog, geo)
        geo.reuse = () if geo.stage else _broadcast_reuse(geo)
    if _numel(outer) * max(1, -(-n // vector)) >= 2**31:
        raise Unsupported("more than 2**31 vectors")
    return geo


def vector_width(operands: list, by_stores: bool | None = None) -> int:
    """Elements per vector: 16 bytes of the narrowest operand accessed in vectors, at most
    16 bytes of the widest such store (``VECTOR_BY_STORES``), at most MAX_VECTOR."""
    vec = [o.dtype.itemsize for o in operands if o.inner_mode == "vec"]
    if not vec:
        return 1
    stores = [o.dtype.itemsize for o in operands if o.inner_mode == "vec" and o.is_store]
    vector = min(MAX_VECTOR, max(1, 16 // min(vec)))
    if stores and (VECTOR_BY_STORES if by_stores is None else by_stores):
        vector = min(vector, max(1, 16 // max(stores)))
    return vector


def flat_rows(geo: Geometry, vector: int, pointwise: bool = False) -> bool:
    """Whether a kernel narrowed below ``vector`` (rows of odd length: a row starts 16 bytes
    apart from the last only every few rows) can still load and store whole vectors of the
    flat run of its rows, where they lie back to back (``Operand.back_to_back``, the first
    element aligned to the vector):
    - a row kernel, looped or holding its row in registers, every operand written along the
      rows so: it takes the vectors of the run that overlap its row, an aligned middle and an
      edge vector at each end shared with the neighbouring rows, whose elements it reads and
      writes one by one (``cute_emit.build_rows``). Operands read once per row (a row value,
      a broadcast) are as they are; a weight every row reads along N (which the row's shift
      misaligns) element by element; any other operand not back to back is not. A row in
      registers of FLAT_MIN_VECTORS vectors or more (a looped row is longer);
    - a pointwise kernel (rows of at least ``vector`` elements, its stores so): a thread
      computes one vector of the run, which may span two rows; the operands not so (a bias
      along the rows, a value per row) are read element by element at
      each element's row and column (``cute_emit._flat_pointwise_pieces``: Inductor's
      flat index).
    Not with an iota, a cat/pad or an operand strided along N (which ``_transpose_stage``
    may stage)."""
    if not FLAT_ROWS or geo.vector >= vector or vector <= 1 or len(geo.outer) != 1 or geo.outer_select:
        return False
    if geo.n < vector or (geo.row_vectors and geo.n < FLAT_MIN_VECTORS * vector):
        return False
    rows = geo.outer[0]
    for o in geo.operands:
        if o.iota is not None:
            return False
        if o.back_to_back(rows, geo.n):
            if not _base_aligned(o, geo.bases, vector):
                return False
        elif o.is_store and (pointwise or o.inner_mode != "bcast"):  # stored: back to back, or row values
            return False
        elif not (o.inner_mode == "bcast" or (o.inner_mode == "vec" and (pointwise or o.same_every_row))):
            return False  # read as it is, or element by element: a pointwise operand along N, a row's weight
    return True


def _select_bounds(prog: Program, dim: int | None) -> tuple:
    """The bounds of every cat/pad along domain dim ``dim``."""
    from thunder_fuser.kernels.expr import Select, subexpressions

    exprs = subexpressions(st.expr for st in prog.stores)
    return tuple(e.bounds for e in exprs if isinstance(e, Select) and e.dim == dim)


def _vector_fits(vector, operands, bases, n, has_outer, bounds) -> bool:
    if has_outer and n % vector:
        return False
    if any(b % vector for bs in bounds for b in bs):
        return False
    for o in operands:
        if o.inner_mode != "vec":
            continue
        if o.shape[-1] % vector and o.shape[-1] != n:
            return False
        if any(s % vector for s in o.stride[:-1]):
            return False
        if not _base_aligned(o, bases, vector):
            return False
    return True


def _base_aligned(o: Operand, bases, vector: int) -> bool:
    """Whether operand ``o``'s first element is aligned to a vector of ``vector`` elements."""
    return (bases[o.source].data_ptr() + o.offset * o.dtype.itemsize) % (vector * o.dtype.itemsize) == 0


def _broadcast_reuse(geo: Geometry) -> tuple:
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


def _transpose_stage(prog: Program, geo: Geometry) -> tuple:
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


def aligned(checks, tensors) -> bool:
    """Per call: do the base pointers still allow the vector width the kernel assumes?
    ``checks``: (base index, byte offset, alignment) triples, from ``Geometry.align_checks``."""
    for source, byte_offset, align in checks:
        if (tensors[source].data_ptr() + byte_offset) % align:
            return False
    return True


def _call_recipe(geo: Geometry) -> None:
    """What a call needs beyond the base tensors, computed once: which operands are their
    base tensor as it is (passed without a view, or beside the element offset of their first
    element), the view of the others, and which base pointers to check."""

    def view(o):
        b = geo.bases[o.source]
        if o.offset == 0 and tuple(b.shape) == o.shape and b.stride() == o.stride:
            return None
        return (o.shape, o.stride, o.offset)

    ops = geo.operands
    views = [view(o) for o in ops]
    geo.map_ref = _map_ref(geo)
    maps = [None] * len(ops)
    for i in ref_first(len(ops), geo.map_ref):
        if views[i] is not None:
            ref = None if i == geo.map_ref else ops[geo.map_ref]
            maps[i] = _mode_map(ops[i], geo.bases[ops[i].source], ref, _static_modes(geo, ops[i]))
    geo.base_maps = tuple(maps)
    geo.call_views = tuple((o.source, (o.offset if m.offset else None) if m else v) for o, m, v in zip(ops, maps, views))
    if geo.vector > 1:
        geo.align_checks = tuple(
            (o.source, o.offset * o.dtype.itemsize, geo.vector * o.dtype.itemsize)
            for o in geo.operands if vector_access(geo, o)
        )


def _static_modes(geo: Geometry, o: Operand) -> set[int]:
    """The modes of ``o`` whose extents the kernel knows statically, as the signature holds
    them (a piece's N, the pieces of a select along the outermost mode:
    ``cute_emit.fake_operands``): a base map builds them as those numbers."""
    static = set()
    if o.shape[-1] != geo.n:
        static.add(len(o.shape) - 1)
    if geo.outer_select and geo.outer:
        static.add(len(geo.outer) - 1)
    return static


def _map_ref(geo: Geometry) -> int:
    """The operand whose extents a broadcast mode of a base map takes: a store that
    broadcasts along no mode, else a load of the stores' extents that does not (a column
    reduction's input: its one store repeats along the reduced rows)."""
    ops = geo.operands
    first = ops[geo.store_slot[0]]
    stores = [i for i in geo.store_slot if 0 not in ops[i].stride]
    loads = [i for i, o in enumerate(ops) if not o.is_store and o.iota is None and 0 not in o.stride and o.shape == first.shape]
    return next(iter(stores + loads), geo.store_slot[0])


def operand_align(geo: Geometry, o: Operand) -> int:
    """The bytes ``o``'s first element is aligned to, as the kernel assumes it: one vector
    (at most 16 bytes) where it moves vectors, else one element."""
    return min(16, geo.vector * o.dtype.itemsize) if vector_access(geo, o) else o.dtype.itemsize


def vector_access(geo: Geometry, o: Operand) -> bool:
    """Whether the kernel reads or writes ``o`` a vector at a time (its pointer aligned to
    one): along a stride-1 N, except, in a flat run (``flat_rows``), an operand not back to
    back, which it reads element by element."""
    return o.inner_mode == "vec" and (not geo.flat or o.back_to_back(geo.outer[0], geo.n))


# modes of a base map that are no base dim: a broadcast (stride 0, the reference operand's
# extent), or extent 1 with stride 1 (ONE) or 0 (ONE_BROADCAST), as the operand's own mode
# is: the kernel reads a mode whose stride was 1 as contiguous (a vector access), so a
# stride-0 rebuild of it would break its vector view (an all-extent-1 input, x + x)
BROADCAST, ONE, ONE_BROADCAST = -1, -2, -3
PRODUCT = 0  # a Run's extent: the product of its dims' extents


class Run(NamedTuple):
    """A mode made of a run of base dims, outermost first, stepping as one (their strides
    nest: a merge, as ``view`` makes), with the innermost dim's stride. Its extent: PRODUCT
    (the dims' own), None (the reference operand's extent of the mode: a run that spans the
    domain, where the outermost dim may be sliced), or a number (a piece's static extent)."""

    dims: tuple
    extent: int | None = PRODUCT


class BaseMap(NamedTuple):
    """How the launch function builds an operand from its base tensor (``_mode_map``): per
    operand mode a base dim (int >= 0), a Run, BROADCAST, ONE or ONE_BROADCAST; and whether
    its first element lies an offset into the base (a slice's start, a selected index). The
    offset is passed beside the base per call, a number the plan holds, not compiled in: a
    slice at another start (a cache written at each position) takes the same kernel."""

    modes: tuple
    offset: bool = False


def _mode_map(o: Operand, base: torch.Tensor, ref: Operand | None, static: set = frozenset()) -> BaseMap | None:
    """Operand ``o`` as a BaseMap of its base tensor, so that a call passes the base as it
    is rather than an ``as_strided`` of it (3-4 us each on the H100 host): each mode a base
    dim, a run of them merged (its outermost dim perhaps sliced), a broadcast or extent 1.
    None where the view is not that (dims that do not nest, a slice of an inner dim).

    Each mode's innermost base dim is the one with its stride, and the run grows outward
    while the next dim's stride is the run's size times its own; extent-1 dims that nest so
    join it even past its extent, which keeps the map, and so the kernel, the same for a
    batch of 1 as for a batch of 16. A run in one of the ``static`` modes takes its extent
    as a number, as the kernel knows it. The map is checked by rebuilding the view's layout
    from the base's: a plan's calls share its base strides (its key) and extents (thunder's
    trace), so the layout rebuilt per call is the view's."""
    if base.ndim == 0:
        return None
    bshape, bstride = tuple(base.shape), base.stride()
    ones_first = sorted(range(base.ndim), key=lambda e: bshape[e] != 1)
    used, modes = set(), []
    for j, (ext, st) in enumerate(zip(o.shape, o.stride)):
        if ext == 1:
            modes.append(ONE if st else ONE_BROADCAST)
            continue
        if st == 0:
            if ref is None or ref.shape[j] != ext:
                return None
            modes.append(BROADCAST)
            continue
        free = [d for d in range(base.ndim) if d not in used and bshape[d] > 1]
        d = next((d for d in free if bstride[d] == st), None)
        if d is None:
            return None
        dims, size = [d], bshape[d]
        while True:  # extent-1 dims that nest join too, so that a batch of 1 maps as a batch of 16 does
            outer = next((e for e in ones_first if e not in used and e not in dims and bstride[e] == size * st
                          and (size < ext or bshape[e] == 1)), None)
            if outer is None:
                break
            dims.insert(0, outer)
            size *= bshape[outer]
        if size < ext or ext % (size // bshape[next(e for e in dims if bshape[e] > 1)]):
            return None  # the dims do not reach the extent, or a slice cuts an inner dim
        used.update(dims)
        if len(dims) == 1 and size == ext:
            modes.append(d)
        elif j in static:
            modes.append(Run(tuple(dims), ext))
        elif ref is not None and ref.shape[j] == ext and ref.stride[j] != 0:
            modes.append(Run(tuple(dims), None))
        else:
            modes.append(Run(tuple(dims), PRODUCT if size == ext else ext))
    m = BaseMap(tuple(modes), o.offset != 0)
    if mapped_layout(m, bshape, bstride, None if ref is None else ref.shape) != (o.shape, o.stride):
        return None
    return m


def mapped_layout(m: BaseMap, shape, stride, ref_shape) -> tuple[tuple, tuple]:
    """(shape, stride) of the operand built from a base of ``shape``/``stride`` by map ``m``
    (``Geometry.base_maps``); plain indexing and products, so the launch function (CuTe
    values) and ``torch_eval`` (ints) share it. ``ref_shape``: the reference operand's
    extents (None for the reference itself, whose map takes none)."""
    extents, strides = [], []
    for j, e in enumerate(m.modes):
        if isinstance(e, Run):
            if e.extent == PRODUCT:
                size = shape[e.dims[0]]
                for d in e.dims[1:]:
                    size = size * shape[d]
            else:
                size = ref_shape[j] if e.extent is None else e.extent
            extents.append(size)
            strides.append(stride[e.dims[-1]])
        else:
            extents.append(shape[e] if e >= 0 else (ref_shape[j] if e == BROADCAST else 1))
            strides.append(stride[e] if e >= 0 else (1 if e == ONE else 0))
    return tuple(extents), tuple(strides)


def ref_first(n: int, ref: int) -> list[int]:
    """Operand indices with the map's reference first: its extents must exist before a
    broadcast mode takes them."""
    return [ref] + [i for i in range(n) if i != ref]


def row_splits(rows: int, n: int, vector: int, sm_count: int) -> tuple[int, int]:
    """(splits per row, vectors per split) for a row reduction of ``rows`` rows of ``n``
    elements: at most one wave of SPLIT_BLOCKS_PER_SM blocks per SM over all rows (a
    fraction of a second wave would cost a whole one), each thread walking at least
    SPLIT_MIN_VECTORS vectors of its split."""
    nvec = -(-n // vector)
    splits = max(1, min(SPLIT_BLOCKS_PER_SM * sm_count // rows, nvec // (SPLIT_THREADS * SPLIT_MIN_VECTORS)))
    per = -(-nvec // splits)
    return -(-nvec // per), per


def _splits_rows(prog: Program, geo: Geometry, sm_count: int) -> bool:
    """Does this row reduction split its rows across blocks (see SPLIT_MIN)? Sets
    ``geo.splits`` where it does; NeedsSplit where it would, but its full-domain stores use
    its reductions."""
    rows = _numel(geo.outer)
    splits = row_splits(rows, geo.n, geo.vector, sm_count)
    if splits[0] < SPLIT_MIN:
        return False
    _check_two_launch_program(prog, f"{rows} long row(s) split across blocks")
    geo.splits = splits
    return True


def _row_tiling(geo: Geometry, sm_count: int, once: bool = False) -> None:
    """Threads per row and vectors per thread for a row held in registers (up to
    REGISTER_ROW_ELEMENTS); a longer row gets ``row_vectors = 0``: each reduction re-reads
    it (looped passes), from L2 where the rows resident on all SMs fit LOOP_L2_BYTES, so
    its block is the narrowest of LOOP_THREADS whose resident rows fit (more blocks per SM
    hide more latency), or the widest; a row read ``once`` (``expr.reads_rows_once``) takes
    the narrowest, as nothing is re-read. Its last pass marks its loads last use from
    LOOP_LAST_USE_BYTES of the row's own operands on."""
    # a flat row's middle (``flat_rows``) holds at most (n - 2) // vector whole vectors; its
    # two edge vectors ride apart
    nvec = max(1, (geo.n - 2) // geo.vector) if geo.flat else -(-geo.n // geo.vector)
    if geo.n <= REGISTER_ROW_ELEMENTS:
        for threads in ROW_THREADS:
            k = -(-nvec // threads)
            wider = 2 * threads if 2 * threads in ROW_THREADS else 0  # the block twice as wide, if any
            paired = wider and -(-nvec // wider) * geo.vector <= PAIRED_BLOCK_ELEMENTS
            if k <= MAX_ROW_VECTORS and (k <= 4 or (threads >= WIDE_ROW_THREADS and not paired)
                                         or k * geo.vector <= ROW_ELEMENTS):
                geo.row_threads, geo.row_vectors, geo.last_use = threads, k, False
                return
    row_bytes = geo.n * sum(o.dtype.itemsize for o in geo.operands if not o.is_store and o.inner_mode != "bcast")
    fits = [t for t in LOOP_THREADS if once or (MAX_THREADS_PER_SM // t) * sm_count * row_bytes <= LOOP_L2_BYTES]
    geo.row_threads, geo.row_vectors = (fits[0] if fits else LOOP_THREADS[-1]), 0
    geo.last_use = geo.n * sum(o.dtype.itemsize for o in geo.operands if not o.is_store and o.inner_mode != "bcast"
                               and not o.same_every_row) >= LOOP_LAST_USE_BYTES


class NeedsTranspose(Unsupported):
    """A row reduction reads operands (``loads``) contiguous across its rows: it runs as a
    pointwise program that copies them, staged through shared memory, into temporaries in
    dim order ``order`` (its rows'), then the reduction reading those
    (``expr.transpose_first``)."""

    def __init__(self, message: str, loads: list, order: tuple):
        super().__init__(message)
        self.loads, self.order = loads, order


def _check_rows_read_in_vectors(prog: Program, geo: Geometry, order) -> None:
    """NeedsTranspose where a row reduction would read an operand element by element
    along its rows that a pointwise kernel could stage (``_transpose_stage``) and that spans
    the whole domain (a broadcast one's copy would be larger than itself)."""
    stage = _transpose_stage(prog, geo)
    slots = {i for i in stage[1] if 0 not in geo.operands[i].stride} if stage else set()
    loads = [ld for ld in prog.loads if geo.load_slot[id(ld)] in slots and not ld.row]
    if loads:
        names = ", ".join(ld.source.name for ld in loads)
        raise NeedsTranspose(f"{names} contiguous across the rows of a reduction", loads, tuple(order))


class NeedsStages(Unsupported):
    """A row reduction whose reduced dims are runs apart in memory (a batch norm's
    statistics over N, H and W of an NCHW tensor): it runs in two stages
    (``expr.reduce_in_stages``), first over ``inner`` (the innermost run, a row kernel
    over the domain), into fp32 partials laid out in dim order ``order`` (the kept dims,
    then the other reduced ones innermost), then over the other reduced dims, a row
    kernel again, reading the partials."""

    def __init__(self, message: str, inner: tuple, order: tuple):
        super().__init__(message)
        self.inner, self.order = inner, order


class NeedsSplit(Unsupported):
    """A column program, or one whose rows split across blocks, stores values computed from
    its own reductions over the whole domain: it runs as two programs
    (``expr.split_at_reductions``)."""


def _check_two_launch_program(prog: Program, what: str) -> None:
    """A column reduction, or a row reduction split across blocks, finishes its reductions
    only after every block is done (a second launch combines the blocks' partial results),
    so no other reduction and nothing stored over the whole domain may depend on one:
    NeedsSplit otherwise (``expr.split_at_reductions``)."""
    if any(has_reduce(e.arg) for e in reductions_in_order(prog)):
        raise NeedsSplit(f"{what}, and a reduction inside another's argument")
    for st in prog.stores:
        if not st.is_row and has_reduce(st.expr):
            raise NeedsSplit(f"{what}, and {st.target.name} computed from a reduction over the whole domain")


def column_state_offsets(reduces) -> list[int]:
    """Where each reduction's partials start in the workspace of a column reduction (or of
    split rows), in blocks of N columns (of M rows): one block per reduction, two for var
    (a mean and a sum of squared deviations). The last entry is the total."""
    offsets = [0]
    for e in reduces:
        offsets.append(offsets[-1] + (2 if e.op == "var" else 1))
    return offsets


def column_splits(geo: Geometry, sm_count: int, var: bool = False) -> tuple[int, int]:
    """(splits of the reduced extent, rows per split) for a column reduction: enough blocks
    for COLUMN_BLOCKS_PER_SM per SM (at most COLUMN_VAR_SPLITS_PER_SM splits per SM where
    ``var`` is among the reductions), each thread still reading at least four rows."""
    m = _numel(geo.outer)
    groups = COLUMN_THREADS // geo.col_vectors
    blocks_x = -(-(-(-geo.n // geo.vector)) // geo.col_vectors)
    most = COLUMN_VAR_SPLITS_PER_SM * sm_count if var else m
    splits = max(1, min(-(-COLUMN_BLOCKS_PER_SM * sm_count // max(1, blocks_x)), most, -(-m // (4 * groups))))
    per = max(1, -(-m // splits))
    return max(1, -(-m // per)), per


def views_for_call(geo: Geometry, bases) -> tuple:
    """Each operand as the launch takes it: its base tensor itself where that is the
    operand's view or the launch function builds the view from it (``Geometry.base_maps``),
    with the element offset of its first element beside it where it has one, else one
    ``as_strided`` (per call: 1-4 us each)."""
    return tuple([
        bases[i] if v is None else (bases[i], v) if isinstance(v, int) else
        bases[i].as_strided(v[0], v[1], bases[i].storage_offset() + v[2])
        for i, v in geo.call_views
    ])
