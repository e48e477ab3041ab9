"""A reduction over a few elements is a pointwise op over that many slices.

The grouped-query expand's backward sums the gradient of ``k.repeat_interleave(r, 1)``
over ``r`` (4 in Llama-3, 7 in Qwen2): ``[b, g, r, s, e] -> [b, g, s, e]``, a reduced dim
between kept ones. No row kernel takes it (the reduced dim is not innermost) and no column
kernel either (the kept dims are two runs apart), so it ran on the reference backend, once
per layer. Written as ``x[:, :, 0] + x[:, :, 1] + ...`` it is pointwise: each
slice is a strided view the kernel reads as it is, the sum joins the pointwise work around
it (the RoPE backward that follows), and it reads each element once, as a reduction would.
Only such reductions are rewritten: with kept dims on both sides of the reduced ones;
elsewhere a row or a column kernel takes them (a norm's weight gradient over 8 rows rides
in the row kernel of its input gradient).

Sums of 16-bit floats add in fp32 and round once at the end, as a reduction does. Reduced
dims of extent one reduce nothing and are left out of the count (at batch 1 the expand's
backward sums over the batch dim too); a reduction over such dims alone is a view that
drops them (``_reduces_nothing``).
"""

from __future__ import annotations

import itertools
import math

import torch

from thunder_fuser.ir.region import Node, Region, Value

SMALL_REDUCTION = 16  # reduced elements per output up to which slices are added instead
_COMBINE = {"sum": "add", "amax": "maximum", "amin": "minimum"}


def small_reductions_as_pointwise(region: Region) -> None:
    nodes = []
    returned = {v.name for v in region.outputs}
    for n in region.nodes:
        if _reduces_nothing(n) and n.output.name not in returned:
            nodes.append(Node("reshape", (n.args[0], tuple(n.output.shape)), {}, (n.output,)))
        else:
            nodes.extend(_unrolled(n) if _is_small(n) else [n])
    region.nodes = nodes


def _reduces_nothing(n: Node) -> bool:
    """Every reduced dim of extent one: a view that drops them. The unsqueeze's backward
    (``broadcast_in_dim`` to ``[b, hk, 1, s, d]`` then a sum over the 1), where grouped-query
    attention hands back K's gradient at its own heads, met the RoPE backward as a reduction
    with an iteration domain of its own: a second kernel. A region output stays a reduction
    (torch allocates its result contiguous, whatever the input's strides)."""
    if n.op not in _COMBINE or not n.output.shape or not n.args[1]:
        return False
    x = n.args[0]
    return all(x.shape[d] == 1 for d in n.args[1]) and n.output.dtype == x.dtype


def _is_small(n: Node) -> bool:
    if n.op not in _COMBINE or not n.output.shape:
        return False
    x = n.args[0]
    # a reduced dim of extent one reduces nothing (at batch 1 the expand's backward sums over
    # the batch dim and the repeats): where the reduction lies is where its other dims are
    dims = {d for d in n.args[1] if x.shape[d] > 1}
    count = math.prod(x.shape[d] for d in dims)
    if count <= 1:
        return False
    # kept dims on both sides: no row kernel (reduced innermost) nor column kernel (kept
    # innermost, one run) takes it in the logical layout; elsewhere they do, better
    outer = any(x.shape[d] > 1 for d in range(min(dims)))
    inner = any(x.shape[d] > 1 for d in range(max(dims) + 1, len(x.shape)))
    return count <= SMALL_REDUCTION and outer and inner


def _unrolled(n: Node) -> list[Node]:
    x, dims, out = n.args[0], tuple(sorted(n.args[1])), n.output
    out.contiguous = True  # as torch allocates a reduction's result, whatever x's layout
    widen = n.op == "sum" and x.dtype in (torch.float16, torch.bfloat16)
    acc_dtype = torch.float32 if widen else out.dtype
    nodes: list[Node] = []
    terms: list[Value] = []
    for k, at in enumerate(itertools.product(*(range(x.shape[d]) for d in dims))):
        start, end = [0] * len(x.shape), list(x.shape)
        for d, j in zip(dims, at):
            start[d], end[d] = j, j + 1
        piece = Value(f"{out.name}_s{k}", tuple(e - s for s, e in zip(start, end)), x.dtype)
        term = Value(f"{out.name}_p{k}", tuple(out.shape), x.dtype)
        nodes.append(Node("slice_prim", (x, start, end, [1] * len(x.shape)), {}, (piece,)))
        nodes.append(Node("reshape", (piece, tuple(out.shape)), {}, (term,)))
        if widen:
            wide = Value(f"{out.name}_f{k}", tuple(out.shape), acc_dtype)
            nodes.append(Node("convert_element_type", (term, acc_dtype), {}, (wide,)))
            term = wide
        terms.append(term)
    acc = terms[0]
    for k, term in enumerate(terms[1:], 1):
        last = k == len(terms) - 1 and not widen
        total = out if last else Value(f"{out.name}_a{k}", tuple(out.shape), acc_dtype, contiguous=True)
        nodes.append(Node(_COMBINE[n.op], (acc, term), {}, (total,)))
        acc = total
    if widen:
        nodes.append(Node("convert_element_type", (acc, out.dtype), {}, (out,)))
    return nodes
