"""A reduction over 2**31 elements or more is two reductions, each over fewer.

The row, split-row and column kernels index a row's length (and a column's height) in
32 bits. A whole-tensor sum of a large tensor is one such row: the z-loss of logits
``[32768, 128256]`` reduces 4.2e9 elements, and a 1-D tensor of 2**32 elements is a row of
that length. Reduced in stages, innermost dims first, each stage's row is shorter than
2**31: ``sum(x, (0, 1))`` is ``sum(sum(x, (1,)), (0,))``, a row kernel over 32768 rows
and a split row over their 32768 partial sums; a single dim too long is first viewed as
``[n / k, k]`` (a reshape), with ``k`` the largest divisor of ``n`` below
``STAGE_ELEMENTS``. The two stages read each element once, as one reduction would.

Only sums, maxima, minima and products are staged (each is its own combine; var is not).
A sum of 16-bit floats keeps its partial sums in fp32 and rounds once at the end. A dim
whose length has no divisor that keeps both stages below 2**31 (a prime) is left as it is,
and torch runs that segment, saying why (``backends/cute/tiling/geometry.needs_64bit_indices``).
"""

from __future__ import annotations

import math

import torch

from thunder_fuser.ir.region import Node, Region, Value

# The kernels' extents are 32-bit integers below this (a margin below 2**31 covers a
# vector's or a block's rounding up); past it they index in 64 bits or not at all
INT32_LIMIT = 2**31 - 2**16
STAGED_OPS = ("sum", "amax", "amin", "prod")
STAGE_ELEMENTS = 2**20  # a split dim's inner extent at most: a row kernel's looped row


def long_reductions_in_stages(region: Region, limit: int | None = None) -> None:
    """Rewrite every staged reduction of ``region`` over ``limit`` (``INT32_LIMIT``) elements or more."""
    limit = limit or INT32_LIMIT
    nodes = []
    for n in region.nodes:
        nodes.extend(_staged(n, limit))
    region.nodes = nodes


def _reduced_count(n: Node) -> int:
    x = n.args[0]
    # a 0-d tensor's reduction names dim 0 (``t.mean(-1)``), which it does not have
    return math.prod(x.shape[d] for d in n.args[1]) if x.ndim else 1


def _staged(n: Node, limit: int) -> list[Node]:
    if n.op not in STAGED_OPS or _reduced_count(n) < limit:
        return [n]
    x, out = n.args[0], n.output
    dims = sorted(n.args[1])
    inner, count = [], 1
    for d in reversed(dims):  # the innermost reduced dims whose elements stay below the limit
        if count * x.shape[d] >= limit:
            break
        inner.insert(0, d)
        count *= x.shape[d]
    if not inner:
        return _split_dim(n, dims[-1], limit)
    wide = n.op == "sum" and out.dtype in (torch.float16, torch.bfloat16)
    part_dtype = torch.float32 if wide else out.dtype
    kept = [d for d in range(x.ndim) if d not in inner]
    part = Value(f"{out.name}_st", tuple(x.shape[d] for d in kept), part_dtype, contiguous=True)
    first = Node(n.op, (x, tuple(inner)), {}, (part,))
    rest = tuple(kept.index(d) for d in dims if d not in inner)
    if not wide:
        return [first, *_staged(Node(n.op, (part, rest), {}, (out,)), limit)]
    total = Value(f"{out.name}_sf", tuple(out.shape), torch.float32, contiguous=True)
    return [first, *_staged(Node(n.op, (part, rest), {}, (total,)), limit),
            Node("convert_element_type", (total, out.dtype), {}, (out,))]


def _split_dim(n: Node, d: int, limit: int) -> list[Node]:
    """Reduced dim ``d`` alone holds ``limit`` elements or more: view it as ``[n / k, k]``."""
    x, out = n.args[0], n.output
    length = x.shape[d]
    k = next((k for k in range(min(STAGE_ELEMENTS, length - 1), 1, -1)
              if length % k == 0 and length // k < limit), None)
    if k is None:
        return [n]
    shape = x.shape[:d] + (length // k, k) + x.shape[d + 1:]
    split = Value(f"{out.name}_sv", shape, x.dtype)
    dims = tuple(sorted({e + (e > d) for e in n.args[1]} | {d + 1}))
    return [Node("reshape", (x, shape), {}, (split,)), *_staged(Node(n.op, (split, dims), {}, (out,)), limit)]
