"""Turn thunder's in-place updates inside a region into ``copy_to_out_`` where that is safe.

thunder 0.2.6 records ``x.add_(y)`` as ``t = add(x, y); r = copy_(t, x)`` wrapped in
``update_aliases`` calls that order later reads. Inside one region we:

1. drop ``update_aliases`` whose tensors cannot share memory (one tensor, once or repeated,
   or distinct storage roots of which at most one is a region input): then it is the
   identity on values;
   groups of several aliases (views of one base) stay, as memory barriers;
2. rewrite ``copy_(computed, dst)`` into ``copy_to_out_(computed, out=dst)`` when the
   contract of the thunder PR holds: ``computed`` is produced in this region by a compute
   op, read by nothing else, and not a region output. The PR's other cases take the safe
   path instead of raising: a ``computed`` defined outside the region or used elsewhere
   keeps a real ``copy_`` (an extra read, never a wrong value);
3. check thunder's rule (``dst`` read after the copy) and the others through
   :func:`storage_roots`, which the segmenter uses to order every read of a written
   tensor around its write (see ``segment/hazards.py``).
"""

from __future__ import annotations

from thunder_fuser.ir.ops import METADATA, kind_of
from thunder_fuser.functionalize.superseded import elide_superseded_writes
from thunder_fuser.ir.region import Node, Region, Value, map_values


class AliasError(RuntimeError):
    """A program whose in-place updates have no defined meaning."""




def storage_roots(region: Region) -> dict[int, Value]:
    """The value whose memory each value may share: a region input for views, copy results
    and alias updates of inputs; the value itself for freshly computed tensors."""
    root: dict[int, Value] = {id(v): v for v in region.inputs}
    for node in region.nodes:
        if node.op in ("copy_", "copy_to_out_"):
            dst = node.written
            root[id(node.output)] = root.get(id(dst), dst)
        elif node.op == "update_aliases":
            for a, o in zip(node.args[0], node.outputs):
                root[id(o)] = root.get(id(a), a)
        elif node.op in METADATA:
            a = node.args[0]
            root[id(node.output)] = root.get(id(a), a)
        else:
            for o in node.outputs:
                root[id(o)] = o
    return root


def _name_outputs_as_the_trace(region: Region, trace_outputs: list[Value]) -> None:
    """A computed output that stands in for a dropped rename takes the trace's name, so the
    segment printout names what the trace returns."""
    produced = {id(o) for n in region.nodes for o in n.outputs}
    taken = {id(v) for v in trace_outputs}
    for old, new in zip(trace_outputs, region.outputs):
        if new is not old and id(new) in produced and id(new) not in taken:
            new.name = old.name
            taken.add(id(new))


def _no_two_share_memory(aliases, roots: dict[int, Value], inputs: set[int]) -> bool:
    """Whether the tensors an ``update_aliases`` lists cannot share memory: one tensor (thunder
    lists a written list element twice), or tensors of distinct storage roots of which at
    most one is a region input (thunder groups a tensor with its own ``.to(other dtype)``, a
    fresh tensor, as a possible view). Then the update is the identity on values, and
    keeping it would end a kernel at each write. Two inputs stay a barrier: values computed
    outside the region may be views of one another."""
    distinct = list({id(a): a for a in aliases}.values())
    found = [roots.get(id(a), a) for a in distinct]
    if len({id(r) for r in found}) < len(distinct):
        return False
    return sum(id(r) in inputs for r in found) <= 1


def functionalize(region: Region) -> Region:
    """Rewrite ``region`` in place (returns it): see the module docstring."""
    roots, inputs = storage_roots(region), {id(v) for v in region.inputs}
    subst: dict[int, Value] = {}
    swap = lambda v: subst.get(id(v), v)  # noqa: E731
    nodes: list[Node] = []
    for node in region.nodes:
        node.args = map_values(node.args, swap)
        node.kwargs = {k: map_values(v, swap) for k, v in node.kwargs.items()}
        if node.op == "update_aliases" and _no_two_share_memory(node.args[0], roots, inputs):
            for a, o in zip(node.args[0], node.outputs):
                subst[id(o)] = a
            continue
        if node.op == "copy_" and node.args[0] is node.args[1]:
            # ``x.copy_(x)`` changes nothing, and torch runs it as nothing, an expanded ``x``
            # included (whose elements share memory: a real write into it is an error)
            subst[id(node.output)] = node.args[1]
            region.self_copies.append(node.args[1])  # still a write for torch's leaf check
            region.notes.append(f"{node.output.name}: copy_ of {node.args[1].name} onto itself: nothing to write")
            continue
        if node.op == "shallow_copy":
            # identity on values (thunder's `.to(same dtype)`): reading through it would
            # hide that a copy's source is fresh, or that a read is aligned with a write
            subst[id(node.output)] = node.args[0]
            node.args[0].contiguous |= node.output.contiguous
            continue
        nodes.append(node)
    region.nodes = nodes
    trace_outputs = region.outputs
    region.outputs = [swap(v) for v in trace_outputs]

    producers = region.producers()
    consumers = region.consumers()
    out_ids = {id(v) for v in region.outputs}
    for i, node in enumerate(region.nodes):
        if node.op != "copy_":
            continue
        computed, dst = node.args[0], node.args[1]
        if not (isinstance(computed, Value) and computed.is_tensor):
            continue
        prod = producers.get(id(computed))
        sole_use = len(consumers.get(id(computed), [])) == 1
        fresh = prod is not None and kind_of(prod.op) in ("pointwise", "reduction", "resize")
        fresh = fresh and computed.shape == dst.shape
        if fresh and sole_use and id(computed) not in out_ids:
            region.nodes[i] = Node(
                "copy_to_out_",
                (computed,),
                {"out": dst},
                node.outputs,
                f"{node.output.name} = copy_to_out_({computed.name}, out={dst.name})",
            )
            region.notes.append(f"{node.output.name}: copy_ of {computed.name} into {dst.name} -> copy_to_out_")
        else:
            why = (
                "is defined outside the region" if prod is None
                else "is read by another op or returned" if not sole_use or id(computed) in out_ids
                else "is a view, not a fresh buffer"
            )
            region.notes.append(f"{node.output.name}: copy_ of {computed.name} into {dst.name} kept: {computed.name} {why}")
    region.rewritten_copies = {n.output.name for n in region.nodes if n.op == "copy_to_out_"}
    _name_outputs_as_the_trace(region, trace_outputs)
    elide_superseded_writes(region, storage_roots(region))
    return region
