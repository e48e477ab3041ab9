"""Elementwise ops read a 0-d value itself, not its broadcast.

thunder treats a 0-d CPU tensor as a number in an elementwise op but broadcasts a 0-d CUDA
tensor to the op's shape (``clang.maybe_broadcast``), so the same program's regions differ
by device: on CUDA a loss's count of the rows that count reaches the gradient through
``broadcast_in_dim(count, (tokens, 1), ())``, a pointwise segment of its own between the
count and the row kernel that scales by it, and the segmenter could no longer run the
count ahead of the row kernel (``segmenter._hoist_per_row_values``). The row kernel then
stored an unscaled fp32 ``[tokens, vocab]`` gradient that a pointwise pass scaled and
narrowed: transformers' Qwen2 on the H100 peaked at 2.87 GiB against torch.compile's 1.77,
with 0.9 ms more GPU time a step. Our kernels read a 0-d operand of an elementwise op as a
value every element shares, as the CPU's regions have them, so the broadcast is dropped
where only such ops read it and each has another operand of the broadcast's shape (which
keeps the result's shape). The CUDA region is then the CPU's, which the CPU tests check.
"""

from __future__ import annotations

from thunder_fuser.ir.ops import BINARY, CAST, TERNARY, UNARY
from thunder_fuser.ir.region import Node, Region, Value, map_values

_ELEMENTWISE = frozenset(UNARY + BINARY + TERNARY + CAST)


def read_scalars_unbroadcast(region: Region) -> None:
    uses = region.consumers()
    outputs = {id(v) for v in region.outputs}
    scalar: dict[int, Value] = {}  # the broadcast's output -> the 0-d value
    for node in region.nodes:
        if node.op != "broadcast_in_dim" or id(node.output) in outputs:
            continue
        s = node.args[0]
        if not (isinstance(s, Value) and s.is_tensor and tuple(s.shape) == ()):
            continue
        b = node.output
        readers = uses.get(id(b), [])
        if readers and all(_keeps_shape(r, b, scalar) for r in readers):
            scalar[id(b)] = s
    if not scalar:
        return
    region.nodes = [n for n in region.nodes if not (n.outputs and id(n.outputs[0]) in scalar)]
    for n in region.nodes:  # in place, as functionalize swaps values
        n.args = map_values(n.args, lambda v: scalar.get(id(v), v))


def _keeps_shape(reader: Node, b: Value, dropped: dict) -> bool:
    """``reader`` is elementwise and another of its operands, not a broadcast already
    dropped, has ``b``'s shape (``add`` of two broadcasts of 0-d values kept one: dropping
    both made the result 0-d, and the region failed to return its ``[1, 1, 1]``)."""
    return reader.op in _ELEMENTWISE and any(
        isinstance(a, Value) and a is not b and id(a) not in dropped and a.is_tensor and tuple(a.shape) == tuple(b.shape)
        for a in reader.args)
