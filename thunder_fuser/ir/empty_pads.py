"""A pad of an empty tensor is a number.

litgpt's rotary embedding rotates the first ``rope_n_elem`` dims of each head and passes
the rest on: ``cat((rotated, x[..., rope_n_elem:]), -1)``. Where every dim is rotated
(Llama, Qwen2.5, Mistral; transformers' Phi3 alike) the tail is empty, and its gradient is
``pad(full((..., 0)), 0.0, ...)``, zeros over the whole head, added to the rotated part's
gradient. As a tensor over an iteration domain of its own it opened a segment, and the add
that reads it and the cat of q's, k's and v's gradients after it followed into that
segment: q's and k's gradients crossed between the two in fp32 (litgpt's Qwen2.5-1.5B at
2 x 2048 tokens, cos and sin aside: a layer that slices its own cos and sin moved 118 MB in
four launches where one launch moves 55; every other layer 176 MB in five launches, 118 in
four with this rule).

Every element of such a pad is its padding value. An elementwise op of two operands
(``_EXACT``) that reads it beside a tensor of the op's shape and of the pad's dtype reads that number
instead: ``x + 0.0`` computes the same bits as ``x + zeros`` (the number is the padding
value as the pad's dtype holds it, cast as the pad's casts cast it). The pads, their casts
and the empty tensors go where nothing else reads them.
"""

from __future__ import annotations

import torch

from thunder_fuser.ir.region import Region, Value

_FOLDED = ("pad", "convert_element_type", "full")
# ops whose number operand gives the bits a tensor of that number gives: not ``div`` (torch
# divides by a number as a product with its reciprocal on CUDA) nor ``pow`` (a number
# exponent takes special cases: 2 squares, 0.5 is a square root)
_EXACT = ("add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _held(value, dtype) -> float:
    """``value`` as a tensor of ``dtype`` holds it."""
    return torch.tensor(value, dtype=dtype).item()


def pads_of_empty_as_numbers(region: Region) -> None:
    outputs = {id(v) for v in region.outputs}
    number: dict[int, float] = {}  # value id -> the number each of its elements holds
    for node in region.nodes:
        if len(node.outputs) != 1 or not node.args:
            continue
        out, a = node.outputs[0], node.args[0]
        if not out.is_tensor or not out.dtype.is_floating_point or not isinstance(a, Value):
            continue
        if node.op == "pad" and a.is_tensor and a.numel == 0 and _number(node.args[1]):
            number[id(out)] = _held(node.args[1], out.dtype)
        elif node.op == "convert_element_type" and id(a) in number:
            number[id(out)] = _held(number[id(a)], out.dtype)
    if not number:
        return
    for node in region.nodes:
        if node.op not in _EXACT or len(node.outputs) != 1 or len(node.args) != 2:
            continue
        out = node.outputs[0]
        args = list(node.args)
        for i, a in enumerate(args):
            b = args[1 - i]
            if (isinstance(a, Value) and id(a) in number and isinstance(b, Value) and b.is_tensor
                    and id(b) not in number and tuple(b.shape) == tuple(out.shape) and b.dtype == a.dtype):
                args[i] = number[id(a)]
        node.args = tuple(args)
    _drop_unread(region, outputs)


def _drop_unread(region: Region, outputs: set) -> None:
    """The pads, casts and fulls no node reads any more and the region does not return."""
    reads: dict[int, int] = {}
    for node in region.nodes:
        for v in node.inputs():
            reads[id(v)] = reads.get(id(v), 0) + 1
    kept = []
    for node in reversed(region.nodes):
        unread = all(reads.get(id(o), 0) == 0 and id(o) not in outputs for o in node.outputs)
        if node.op in _FOLDED and unread:
            for v in node.inputs():
                reads[id(v)] -= 1
            continue
        kept.append(node)
    region.nodes = kept[::-1]
