"""Reshapes moved before the pointwise ops that make their operand, so that those ops take
the iteration domain of the reshape's reader (a loss's rows, a norm's).

``reshape(f(x, ...))`` becomes ``f(reshape(x), ...)``, where the chain above the reshape
holds no reduction:

- transformers' loss upcasts the ``[b, s, vocab]`` logits, then flattens them:
  ``logits.float().view(-1, vocab)``. The upcast's domain was ``[b, s, vocab]``, the loss's
  row kernel's ``[b * s, vocab]``, so the segmenter split them and stored an fp32 copy of the
  logits (1.2 GB at 2 x 1024 tokens of Qwen2's 151936 columns).
- GPT-2's projections (transformers' ``Conv1D``: ``addmm`` over ``[b * s, n]``) add their
  bias and the residual over ``[b * s, n]``, then ``view`` back to ``[b, s, n]`` for the next
  LayerNorm: the adds were a kernel of their own, and the norm read their fp32 upcast back
  from memory. An op of several operands moves too: each operand is reshaped, and a
  broadcast (the bias) is broadcast into the new shape instead, where the dims it keeps stay
  whole dims of it.

A reduction (or a cat/pad/slice) above a reshape anchors it: the domain there is the
reduction's, and moving the reshape into it would split the reduction's kernel where it
meets the moved ops (GPT-2's LayerNorm output, rounded to bf16 and then flattened for the
next projection: moving the flatten before the rounding made the rounding a kernel of its
own). Only where the moved op's result is read by the reshape alone and is not a region
output (else both shapes would be computed). The new nodes take the op's place, so the op
reads its operands when it did (a later in-place write into one must not be seen).
"""

from __future__ import annotations

from thunder_fuser.ir.ops import BINARY, CAST, RESIZE, REDUCTION, TERNARY, UNARY
from thunder_fuser.ir.region import Node, Region, Value
from thunder_fuser.ir.reshape_groups import reshape_groups

_ONE_INPUT = frozenset(UNARY + CAST)
_ELEMENTWISE = frozenset(UNARY + CAST + BINARY + TERNARY)
_ANCHORS = frozenset(REDUCTION + RESIZE)


def reshape_first(region: Region) -> None:
    changed = True
    while changed:  # a chain (convert, then neg, then a reshape) moves one op per round
        changed = _one_round(region)


def _anchored(region: Region) -> set[int]:
    """The ids of the values a reduction or a cat/pad/slice of the region lies above (the
    nodes are in order: a node's operands come before it)."""
    anchored: set[int] = set()
    for n in region.nodes:
        if n.op in _ANCHORS or any(id(a) in anchored for a in _tensor_args(n)):
            anchored.update(id(o) for o in n.outputs)
    return anchored


def _feeding(region: Region) -> set[int]:
    """The ids of the values a reduction of the region reads, directly or through other ops."""
    feeding: set[int] = set()
    for n in reversed(region.nodes):
        if n.op in REDUCTION or any(id(o) in feeding for o in n.outputs):
            feeding.update(id(a) for a in _tensor_args(n))
    return feeding


def _tensor_args(node: Node):
    return [a for a in node.args if isinstance(a, Value) and a.is_tensor]


def _one_round(region: Region) -> bool:
    producer = region.producers()
    uses = region.consumers()
    outputs = {id(v) for v in region.outputs}
    anchored = _anchored(region)
    feeding = _feeding(region)
    replaced: dict[int, list[Node]] = {}
    dropped: set[int] = set()
    for node in region.nodes:
        if node.op != "reshape":
            continue
        y = node.args[0]
        if not isinstance(y, Value) or not y.is_tensor:
            continue
        p = producer.get(id(y))
        if (p is not None and id(p) not in replaced and id(y) not in outputs
                and len(uses.get(id(y), ())) == 1 and id(y) not in anchored):
            moved = _moved_toward_inputs(p, y, tuple(node.output.shape), node.outputs, id(node.output) in feeding)
            if moved is not None:
                replaced[id(p)] = moved
                dropped.add(id(node))
    if not replaced:
        return False
    nodes = []
    for n in region.nodes:
        if id(n) not in dropped:
            nodes.extend(replaced.get(id(n), [n]))
    region.nodes = nodes
    return True


def _moved_toward_inputs(p: Node, y: Value, shape: tuple, outputs, feeds: bool) -> list[Node] | None:
    """The nodes computing ``reshape(y, shape)`` (into ``outputs``) as ``p`` over reshaped
    operands, at ``p``'s place, or None where ``p`` does not commute with the reshape. An op
    of several operands (or a broadcast) moves only where the reshape ``feeds`` a reduction,
    which sets the domain: elsewhere its operands' other readers keep the old one, and the
    moved op would split from them (Qwen2's SwiGLU backward, flattened for the projections'
    gradients, into two kernels)."""
    if p.op not in _ONE_INPUT and not feeds:
        return None
    if p.op == "broadcast_in_dim":
        rebroadcast = _broadcast_reshaped(p, shape)
        return None if rebroadcast is None else [Node("broadcast_in_dim", (p.args[0], shape, rebroadcast), {}, outputs)]
    if p.op not in _ELEMENTWISE:
        return None
    operands = _tensor_args(p)
    if not operands or any(tuple(a.shape) != tuple(y.shape) for a in operands):
        return None  # a 0-d tensor beside full ones (a CPU scalar) is not reshaped
    nodes, args = [], []
    for i, a in enumerate(p.args):
        if isinstance(a, Value) and a.is_tensor:
            flat = Value(f"{y.name}_r{i}", shape, a.dtype)  # named after the moved op's result: unique
            nodes.append(Node("reshape", (a, shape), {}, (flat,)))
            args.append(flat)
        else:
            args.append(a)
    return nodes + [Node(p.op, tuple(args), dict(p.kwargs), outputs)]


def _broadcast_reshaped(p: Node, shape: tuple) -> tuple | None:
    """The broadcast dims that put ``p``'s operand into ``shape`` where ``p`` broadcasts it
    into a shape that reshapes to ``shape``: each dim the operand keeps (its extent > 1) must
    be a whole dim on both sides of the reshape (a bias along the last dim, the leading dims
    merged or split); None otherwise."""
    x, before, dims = p.args[0], tuple(p.args[1]), tuple(p.args[2])
    groups = reshape_groups(before, shape) if 0 not in before else None
    if groups is None:
        return None
    at = {src[0]: dst[0] for src, dst in groups if len(src) == len(dst) == 1}  # dims kept whole
    new = []
    for k, d in enumerate(dims):
        if x.shape[k] == 1 and before[d] != 1:
            return None  # a size-1 dim broadcast along a dim: its place in ``shape`` is not one dim
        if d not in at:
            return None
        new.append(at[d])
    if any(b <= a for a, b in zip(new, new[1:])):
        return None
    return tuple(new)
