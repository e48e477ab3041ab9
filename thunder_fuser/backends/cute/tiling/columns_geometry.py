"""Layout math of the column family (``columns.py``): how many splits of the reduced extent
a column reduction's blocks take, and where each reduction's partials lie in the workspace
that the finalize (``partials.py``) reads, as split rows and sums per column do too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from thunder_fuser.backends.cute.tiling.operands import Geometry

COLUMN_THREADS = 256  # a column block: col_vectors column vectors x (256 / col_vectors) row groups
COLUMN_BLOCKS_PER_SM = 8  # the splits of a column reduction fill this many blocks per SM,
COLUMN_VAR_SPLITS_PER_SM = 2  # but a var's make at most this many splits per SM: the second launch
# merges a var's splits one after the other (Chan's merge, a division each), and with few
# columns (a channels-last batch norm's 64-256 channels, one block wide) eight blocks per SM
# meant 1056 splits, whose merges took a quarter of the time. var_mean over (0, 2, 3) of NHWC
# bf16 [64, 256, 56, 56] took 0.070 ms with 1056 splits, 0.053 with 264 (H100,
# scripts/column_probe.py). A sum's splits add cheaply: sum(0) over [262144, 256] bf16 took
# 0.057 ms with 1056 splits and 0.071 with 264.
COLUMN_MIN_ROWS = 4  # rows each thread of a split reads, at least
# Both kept by a sweep (H100, bf16, x [4096, 10240] + bias, tanh-GELU's backward with the
# bias gradient, partial launch us): 99.9 at 8 blocks per SM and 4 rows; 122.6 / 105.9 /
# 106.1 / 104.3 / 102.9 / 102.5 at 2 / 3 / 4 / 6 / 12 / 16 blocks per SM; 100.0 / 100.1 /
# 101.5 at 8 / 16 / 32 rows (Inductor's fused reduction: 134.3). A bias gradient alone over
# [4096, 2560]: 15.5-17.5 us whatever the two (Inductor 10.9 + 2.5).


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
    ``var`` is among the reductions), each thread still reading at least COLUMN_MIN_ROWS rows."""
    m = math.prod(geo.outer)
    groups = COLUMN_THREADS // geo.col_vectors
    blocks_x = -(-(-(-geo.n // geo.vector)) // geo.col_vectors)
    most = COLUMN_VAR_SPLITS_PER_SM * sm_count if var else m
    splits = max(1, min(-(-COLUMN_BLOCKS_PER_SM * sm_count // max(1, blocks_x)), most, -(-m // (COLUMN_MIN_ROWS * groups))))
    per = max(1, -(-m // splits))
    return max(1, -(-m // per)), per
