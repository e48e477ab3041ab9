"""Layout math of the row family (``rows.py``, ``split_rows.py``): threads per row and
vectors per thread for a row held in registers, the block of a row too long for them
(looped passes), how many ways a few long rows split across blocks, and the grid of a row
kernel that also sums per column. Each constant carries the measurements that set it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thunder_fuser.backends.cute.tiling.operands import Geometry

# Threads per row held in registers: the fewest whose vectors fit (``row_tiling``). Rows
# of a part of a warp (4-16 threads) keep each thread's loads several and the warp's rows
# many: H100, scripts/long_rows_probe.py, softmax of bf16 [262144, 64] 0.071 ms in rows of
# a warp, 0.026 in rows of 4 threads; a ViT's [64, 12, 197, 197] 0.127 -> 0.054 (8
# threads); [65536, 256] and a layer norm of [65536, 512] alike (0.026, 0.050).
ROW_THREADS = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
MAX_ROW_VECTORS = 8  # per thread: a persistent row holds at most 8 vectors per value, and
# more than 4 only in blocks of WIDE_ROW_THREADS threads or more, or where they are at most
# ROW_ELEMENTS elements (``row_tiling``); in blocks of WIDE_ROW_THREADS only where a block
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
# Tried and dropped: a longer row shared by the blocks of a thread-block
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
# 1024, 0.202 in 512; 256 and 128 no faster. Measured and not kept (ms, H100):
# - the passes alternating direction, each re-read starting on the lines the pass before
#   read last: log_softmax of bf16 [4096, 32000] 0.314 -> 0.350, softmax [2048, 128256]
#   0.427 -> 0.441, layer_norm [2048, 65536] 0.222 -> 0.229 ([1024, 128256] 0.427 -> 0.419);
# - registers capped (``.minnctapersm``) so that the blocks the L2 rule counts are resident
#   (60 registers leave one block of 1024 per SM): ptxas spills in the loop, twice as slow;
# - 8 vectors per loop step (``cute_memory.STREAM_UNROLL`` is 4) in every pass, or in one kind
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
# the rows other blocks have yet to re-read (``rows.CACHE_HINTS``). H100,
# scripts/long_rows_probe.py, ms with no hints / stores / loads / both: log_softmax of bf16
# [1024, 128256] 0.461 / 0.456 / 0.458 / 0.427, softmax bf16 [2048, 128256] 0.523 / 0.519 /
# 0.452 / 0.430, layer_norm bf16 [2048, 65536] 0.232 / 0.234 / 0.224 / 0.229. Shorter rows
# keep plain loads: log_softmax of bf16 [4096, 32000] (64 KiB rows, which L1 may still hold
# for the re-read) took 0.324 with no hints, 0.314 with streamed stores, and 0.334 in an
# earlier call with both.
LOOP_LAST_USE_BYTES = 128 << 10
# A looped row steps ``cute_memory.LOOP_UNROLL`` (2) vectors per loop step, its passes before
# the last load with an L2 evict-last policy where the last pass marks its loads last use
# (``rows.CACHE_HINTS``: "keep"), and a last pass storing only fp16/bf16 takes its exps as
# ex2.approx (``cute_values.fast_exp``). H100, torch.profiler, ms of the row
# kernel with the exact exp in steps of 4 vectors (before) / fast exp, 4 / fast exp, keep, 2:
# the loss (``F.cross_entropy``, its gradient in the forward) over bf16 [8192, 128256] 1.822 /
# 1.909 / 1.588, [4096, 50257] 0.522 / 0.615 / 0.415, [4096, 32000] 0.290 / 0.370 / 0.251;
# softmax of bf16 [2048, 128256] 0.447 / 0.375 / 0.396, [4096, 32000] 0.238 / 0.183 /
# 0.194; log_softmax of bf16 [1024, 128256] (no exp in its last pass) 0.191 / 0.191 / 0.196.
# ncu on the loss at [8192, 128256]: before, 928M instructions, issue 57% busy; in steps of 4
# the 64 registers a block of 1024 allows spill (23M local requests with the fast exp, and
# DRAM reads rise from 2.37 to 2.63 GB); in steps of 2, 64 registers, no spill, 2.26 GB read
# and 2.08 written (the gradient once). Tried on the loss with the fast exp: 3 vectors 1.624,
# 2 without "keep" 1.625, blocks of 512 1.694, a persistent grid of two blocks of 512 per SM
# looping over the rows 1.662 (without "keep" 1.676; in steps of 2, 1.984: DRAM reads 3.42
# GB), of one block of 1024 per SM 1.722.
MAX_THREADS_PER_SM = 2048
# A row kernel gives each row one block, and one block streams only 65-100 GB/s on an H100
# (scripts/gather_rows_probe.py: x.sum() of 64M fp32 took 2.64 ms as one row, torch 0.095;
# a [4, 4M] bf16 product summed per row 0.25 ms, eager 0.05). A row reduction whose rows
# take at least SPLIT_MIN splits (``row_splits``: one wave of SPLIT_BLOCKS_PER_SM blocks per
# SM over all rows, each thread walking at least SPLIT_MIN_VECTORS vectors) therefore
# splits every row across blocks: each block reduces its stretch of the row into a partial,
# and a second launch combines them, as the column reductions do
# (``split_rows.build_split_rows``). On the H100 that is up to 66 long rows: 48 rows of 1M
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
# Measured and not kept (H200, diag probe, x + norm(x) of bf16 [4096, N], forward and
# backward through thunder, partial launch us): 512 threads per SM for 32 registers (RMSNorm N
# = 1536 / 2048 / 4096: 20.4 -> 23.8 / 27.5 -> 33.9 / 43.4 -> 51.5); rows spread over more
# threads of 1 or 2 vectors each, 512-1024 threads per SM: RMSNorm within 9% either way
# (2048: 25.1, the best), layer norm [4096, 2560] slower (46.3 -> 56-62). The same probe's
# whole forward and backward: ours 40 us at N = 2048 against torch.compile's 51, 51 against
# 101 at 3072, so the zoo's norm group behind Triton's is not this kernel alone.
COLUMN_SUM_REGISTERS = 64
ACROSS_THREADS_PER_SM = {32: 384, 64: 256}  # the registers the sums hold (at most) -> threads per SM


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
    row_blocks = -(-math.prod(geo.outer) // rows)
    per_sm = next(t for most, t in sorted(ACROSS_THREADS_PER_SM.items()) if held <= most)
    blocks = max(1, min(row_blocks, sm_count * max(1, per_sm // threads)))
    per = -(-row_blocks // blocks)
    return -(-row_blocks // per), per


def row_splits(rows: int, n: int, vector: int, sm_count: int) -> tuple[int, int]:
    """(splits per row, vectors per split) for a row reduction of ``rows`` rows of ``n``
    elements: at most one wave of SPLIT_BLOCKS_PER_SM blocks per SM over all rows (a
    fraction of a second wave would cost a whole one), each thread walking at least
    SPLIT_MIN_VECTORS vectors of its split."""
    nvec = -(-n // vector)
    splits = max(1, min(SPLIT_BLOCKS_PER_SM * sm_count // rows, nvec // (SPLIT_THREADS * SPLIT_MIN_VECTORS)))
    per = -(-nvec // splits)
    return -(-nvec // per), per


def rows_to_split(geo: Geometry, sm_count: int) -> tuple[int, int] | None:
    """(splits per row, vectors per split) where this row reduction splits its rows across
    blocks (see SPLIT_MIN), else None."""
    splits = row_splits(math.prod(geo.outer), geo.n, geo.vector, sm_count)
    return splits if splits[0] >= SPLIT_MIN else None


def split_row_tiling(geo: Geometry, splits: tuple[int, int]) -> None:
    """A row reduction's rows split across blocks of SPLIT_THREADS (``rows_to_split``)."""
    geo.splits, geo.split_rows, geo.row_threads = splits, True, SPLIT_THREADS


def row_tiling(geo: Geometry, sm_count: int, once: bool = False) -> None:
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
