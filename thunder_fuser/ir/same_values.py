"""One value where a region takes the same view, or the same conversion, of a value twice.

A linear's backward reshapes the output gradient twice, once for each matmul: ``g.reshape(-1,
n)`` for the input gradient and ``g.reshape(-1, n).t()`` for the weight gradient. Where both
land in one region (``hoist_externs.hoist_views`` moves the weight gradient's operands into
the region before the input gradient's matmul), the second reshape would be an operand a
kernel reads through when the first is already an output torch makes after the kernel: the
QKV gradient's cat, reshaped then transposed, has no kernel template, and the segment ran
on the reference backend. Views are pure functions of their operand's memory, so the second
is the first: its readers read the first one, and the view of it is made from an output.

A bf16 step converts the same value twice as well: a norm backward's input gradient is
rounded to bf16 once as the region's output and once more for the residual add and the
reductions after it (transformers' GPT-2, every model's final norm). Each copy was a store
of its own, and a reduction that recomputed the second from the region's inputs read the
norm's per-row statistics broadcast over its kept dims, which the column kernel refuses
(GPT-2's position gradient: a segment on the reference backend). A conversion is a pure
function of its operand's value, so in a region that writes nothing in place the second is
the first too (where a region writes, the same operand may hold another value later).

So is every pointwise op: a value made again in the backward (``passes/recompute_in_backward.py``)
gets names of its own, and where it joins the backward of the op that made it (a GELU's
output made again beside the GELU's gradient, ``hoist_externs.join_across_externs``) the
region computed ``erf`` of the same scaled input twice. Numbers key by type and bits (``-0.0``
is no ``0.0``, ``1.0`` no ``1``), and a node by its output's dtype and shape too.

A conversion of a conversion that holds every value of its operand exactly (bf16 to fp32,
fp32 to fp64) converts that operand's values: it reads the operand itself. Converted back to
the operand's dtype (autograd's gradient of ``x.float()`` beside that of a later
``.to(bf16)``), it is the operand: pythia's attention output gradient went bf16 -> fp32 ->
bf16 before the output projection's matmuls, a copy kernel of its own a layer. Its readers
read the operand then, which makes the round trip's views views of the operand, so that is
taken only where every region output among them is one whose aliasing nothing observes
(``Region.copyable_outputs``).
"""

from __future__ import annotations

import torch

from thunder_fuser.ir.ops import METADATA, POINTWISE
from thunder_fuser.ir.region import Node, Region, Value, map_values


def _key(node: Node):
    def k(x):
        if isinstance(x, Value):
            return ("v", id(x))
        if isinstance(x, (tuple, list)):
            return tuple(k(e) for e in x)
        if isinstance(x, float):  # -0.0 == 0.0 and 1.0 == 1 == True in Python, not in a kernel
            return ("float", x.hex())
        if isinstance(x, (bool, int)):
            return (type(x).__name__, x)
        return x

    out = node.outputs[0] if node.outputs else None
    try:
        key = (node.op, k(node.args), tuple(sorted((n, k(v)) for n, v in node.kwargs.items())),
               (getattr(out, "dtype", None), getattr(out, "shape", None)))
        hash(key)
    except TypeError:  # an argument that is not hashable: the node stays
        return None
    return key


# (from, through): converting ``from`` to ``through`` and back gives every value back
_EXACT_WIDENINGS = frozenset((
    (torch.bfloat16, torch.float32), (torch.bfloat16, torch.float64),
    (torch.float16, torch.float32), (torch.float16, torch.float64), (torch.float32, torch.float64),
))


def _exactly_converted(node: Node, producers: dict) -> Value | None:
    """``x`` where ``node`` converts a conversion of ``x`` that holds every value of ``x``."""
    if node.op != "convert_element_type" or not isinstance(node.args[0], Value):
        return None
    inner = producers.get(id(node.args[0]))
    if inner is None or inner.op != "convert_element_type" or not isinstance(inner.args[0], Value):
        return None
    x = inner.args[0]
    return x if (x.dtype, inner.output.dtype) in _EXACT_WIDENINGS else None


def _aliasing_unobserved(region: Region, value: Value, consumers: dict, outputs: set) -> bool:
    """Are ``value`` and every view made of it that the region returns outputs whose
    aliasing nothing observes?"""
    todo, seen = [value], set()
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if id(v) in outputs and v.name not in region.copyable_outputs:
            return False
        todo.extend(o for n in consumers.get(id(v), ()) if n.op in METADATA for o in n.outputs)
    return True


def _drop_unread(region: Region) -> None:
    """Drop the nodes (none writes: the caller's rule) whose values nothing reads."""
    outputs = {id(v) for v in region.outputs}
    kept: list[Node] = []
    read = set(outputs)
    for node in reversed(region.nodes):
        if any(id(o) in read for o in node.outputs):
            kept.append(node)
            read.update(id(v) for v in node.inputs())
    region.nodes = kept[::-1]


def same_values(region: Region) -> None:
    """Rewrite ``region`` in place: each later duplicate of a view node, or of a pointwise
    node (a conversion included) where the region writes nothing in place, is dropped, its
    readers reading the first. A region output keeps its value (its name keys what the
    trace knows of it: the matmuls that read it, whether it may be copied): where the
    duplicate is the output, the first node makes that value instead. Two pointwise nodes
    that are both outputs stay two tensors. Where it writes nothing, a conversion of an
    exact widening converts the widening's operand, and one back to the operand's dtype is
    the operand (``_aliasing_unobserved`` permitting); nodes nothing reads then go."""
    writes = bool(region.writes())
    ops = METADATA if writes else METADATA + POINTWISE
    outputs = {id(v) for v in region.outputs}
    producers, consumers = ({}, {}) if writes else (region.producers(), region.consumers())
    first: dict = {}  # key -> the node kept for it
    subst: dict[int, Value] = {}

    def swap(v):
        while id(v) in subst:
            v = subst[id(v)]
        return v

    kept: list[Node] = []
    rewired = False  # a conversion reads the operand of the conversion it read
    renamed = False  # a kept node now makes an output's value: its earlier readers read the old one
    for node in region.nodes:
        if subst:
            node.args = map_values(node.args, swap)
            node.kwargs = {n: map_values(v, swap) for n, v in node.kwargs.items()}
        source = None if writes else _exactly_converted(node, producers)
        if source is not None and source.dtype != node.output.dtype:
            node.args = (source,) + tuple(node.args[1:])  # the same values, one conversion
            rewired = True
        elif source is not None and _aliasing_unobserved(region, node.output, consumers, outputs):
            subst[id(node.output)] = source  # converted there and back
            continue
        key = _key(node) if node.op in ops and len(node.outputs) == 1 else None
        kept_node = first.get(key) if key is not None else None
        if kept_node is None:
            if key is not None:
                first[key] = node
            kept.append(node)
            continue
        mine, theirs = node.output, kept_node.output
        if id(mine) in outputs and id(theirs) in outputs:
            if node.op not in METADATA:  # two tensors the caller holds apart
                kept.append(node)
                continue
            subst[id(mine)] = theirs
        elif id(mine) in outputs:  # the output's value, made where the first was
            kept_node.outputs = (mine,)
            subst[id(theirs)] = mine
            renamed = True
        else:
            subst[id(mine)] = theirs
    if renamed:
        for node in kept:  # readers before a value became an output's
            node.args = map_values(node.args, swap)
            node.kwargs = {n: map_values(v, swap) for n, v in node.kwargs.items()}
    if subst:
        region.nodes = kept
        region.outputs = [swap(v) for v in region.outputs]
    if (subst or rewired) and not writes:
        _drop_unread(region)
