"""Reshape before a one-input pointwise op: ``reshape(f(x))`` becomes ``f(reshape(x))``.

transformers' loss upcasts the ``[b, s, vocab]`` logits, then flattens them:
``logits.float().view(-1, vocab)``. The upcast's iteration domain is ``[b, s, vocab]``, the
loss's row kernel's ``[b * s, vocab]``, so the segmenter split them, and the upcast was stored:
an fp32 copy of the logits (1.2 GB at 2 x 1024 tokens of Qwen2's 151936 columns), with the
iota its target compare broadcasts beside it, where litgpt's loss (which flattens first) is
one row kernel. A pointwise op of one tensor commutes with any reshape, so moving the
reshape onto its input gives the op the consumer's domain, and the segmenter joins it there.

Only where the op's result is read by that reshape alone and is not a region output (else
both shapes would be computed). The pair takes the op's place in the region, so the op reads
its input when it did (a later in-place write into it must not be seen).
"""

from __future__ import annotations

from thunder_fuser.ir.ops import CAST, UNARY
from thunder_fuser.ir.region import Node, Region, Value

_ONE_INPUT = frozenset(UNARY + CAST)


def reshape_first(region: Region) -> None:
    changed = True
    while changed:  # a chain (convert, then neg, then a reshape) moves one op per round
        changed = _one_round(region)


def _one_round(region: Region) -> bool:
    producer = region.producers()
    uses = region.consumers()
    outputs = {id(v) for v in region.outputs}
    replaced: dict[int, list[Node]] = {}
    dropped: set[int] = set()
    for node in region.nodes:
        if node.op != "reshape":
            continue
        y = node.args[0]
        p = producer.get(id(y))
        if p is None or p.op not in _ONE_INPUT or id(p) in replaced or id(y) in outputs or len(uses.get(id(y), ())) != 1:
            continue
        x = p.args[0]
        if not isinstance(x, Value) or not x.is_tensor or tuple(x.shape) != tuple(y.shape):
            continue
        flat = Value(f"{x.name}_r", tuple(node.output.shape), x.dtype)
        # at the op's place, not the reshape's: ``x`` is read when the op read it, before any
        # later in-place write into it (``a.exp()``, ``a.mul_(2)``, then the reshape)
        replaced[id(p)] = [Node("reshape", (x, tuple(node.args[1])), {}, (flat,)),
                           Node(p.op, (flat,) + tuple(p.args[1:]), dict(p.kwargs), node.outputs)]
        dropped.add(id(node))
    if not replaced:
        return False
    nodes = []
    for n in region.nodes:
        if id(n) not in dropped:
            nodes.extend(replaced.get(id(n), [n]))
    region.nodes = nodes
    return True
