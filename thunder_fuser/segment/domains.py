"""Iteration domains: the shape a node is computed over inside a kernel.

A node's domain is its output shape, with two exceptions. A reduction runs over its
input's shape. A small node whose every consumer broadcasts it into a larger domain (a bias
cast, a weight convert) adopts that domain: it is recomputed per element instead of
opening a kernel of its own, bounded by ``MAX_INLINE_CHAIN`` such nodes in a row.
"""

from __future__ import annotations

from thunder_fuser.ir.ops import kind_of
from thunder_fuser.ir.region import Node, Region

MAX_INLINE_CHAIN = 8


def node_domain_of(node: Node) -> tuple[int, ...]:
    if kind_of(node.op) == "reduction":
        return tuple(node.args[0].shape)
    if node.op == "copy_to_out_":
        return tuple(node.kwargs["out"].shape)
    if node.op == "update_aliases":
        return ()
    return tuple(node.outputs[0].shape)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def iteration_domains(region: Region) -> dict[int, tuple[int, ...]]:
    """Domain of every node (keyed by ``id(node)``), with small prologues inlined."""
    dom = {id(n): node_domain_of(n) for n in region.nodes}
    consumers = region.consumers()
    out_ids = {id(v) for v in region.outputs}
    depth: dict[int, int] = {}
    for node in reversed(region.nodes):
        if kind_of(node.op) not in ("pointwise", "view") or any(id(o) in out_ids for o in node.outputs):
            continue
        uses = [c for o in node.outputs for c in consumers.get(id(o), [])]
        if not uses:
            continue
        targets = set()
        for c in uses:
            if c.op == "broadcast_in_dim" or (kind_of(c.op) in ("pointwise", "view") and depth.get(id(c), 0) > 0):
                targets.add(dom[id(c)])
            else:
                targets = set()
                break
        if len(targets) == 1:
            (t,) = targets
            d = 1 + max(depth.get(id(c), 0) for c in uses)
            if _numel(t) > _numel(dom[id(node)]) and d <= MAX_INLINE_CHAIN:
                dom[id(node)] = t
                depth[id(node)] = d
    return dom
