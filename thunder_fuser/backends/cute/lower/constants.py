"""Creation ops in kernel segments: ``iota`` read as a small operand, ``full`` as a number.

A causal mask is the common case: thunder decomposes ``is_causal`` attention into two
``iota`` s, broadcasts, ``ge`` and ``where(mask, scores, -inf)``. The plan runs each
``iota`` once, with torch (an ``[s]`` vector), and the kernel takes it like any other
operand, through the broadcasts that follow it, so the compare runs per element in the
kernel and the mask is never stored. A CuTe kernel does not even load an integer iota:
the operand's view gives each element's index into the vector, and the value is
``start + step * index`` (``Iotas.params``, ``cute_memory.iota_at``); only the torch
backend and float iotas read the vector. A ``full`` is its fill number (``zeros_like``
reads nothing), and a pointwise op over numbers alone is computed at lowering, in its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thunder_fuser.backends import reference
from thunder_fuser.backends.cute.unsupported import Unsupported
from thunder_fuser.ir.region import Node, Value


@dataclass(frozen=True)
class Iotas:
    nodes: tuple[Node, ...]  # the segment's iota nodes
    # id of an iota result -> the value a kernel loads: the result itself, or for a
    # segment output (stored afresh by the kernel each call) a stand-in of its own
    operands: dict

    def params(self) -> dict[int, tuple[int, int]]:
        """``(start, step)`` of each integer iota, by the id of the value the kernel loads:
        a CuTe kernel computes these from the element's index instead of loading them."""
        out = {}
        for n in self.nodes:
            start, step = n.kwargs.get("start", 0), n.kwargs.get("step", 1)
            dtype = n.outputs[0].dtype
            if isinstance(dtype, torch.dtype) and not dtype.is_floating_point and dtype != torch.bool and all(
                type(x) is int for x in (start, step)
            ):
                out[id(self.operands[id(n.outputs[0])])] = (start, step)
        return out

    def evaluate(self) -> dict[int, object]:
        """The operand tensors, by the id of the value the kernel loads (torch, on the
        device each node names); once per plan."""
        env: dict[int, object] = {}
        reference.run_nodes(self.nodes, env)
        return {id(src): env[vid] for vid, src in self.operands.items()}


def find_iotas(nodes, outputs) -> Iotas:
    """The ``iota`` nodes whose arguments are all known when tracing (not run-time numbers)."""
    out_ids = {id(o) for o in outputs}
    chosen = [n for n in nodes if n.op == "iota" and all(v.is_tensor for v in n.inputs())]
    operands = {}
    for n in chosen:
        v = n.outputs[0]
        operands[id(v)] = Value(f"{v.name}_iota", v.shape, v.dtype) if id(v) in out_ids else v
    return Iotas(tuple(chosen), operands)


def typed_number(x, dtype):
    """``x`` as the Python number a kernel constant of ``dtype`` holds."""
    if isinstance(x, complex) or getattr(dtype, "is_complex", False):
        raise Unsupported(f"a complex constant ({x!r})")
    if dtype == torch.bool:
        return bool(x)
    return float(x) if dtype.is_floating_point else int(x)


def fill_number(node: Node):
    """``full`` 's fill, or None when it is a number known only at run time."""
    fill = node.args[1]
    if isinstance(fill, Value):
        return None
    return typed_number(fill, node.outputs[0].dtype)


def number_op(node: Node, args) -> object:
    """A pointwise node over numbers alone (say ``full`` plus 1), computed now in the
    dtypes it has: each argument a 0-d tensor of its value's dtype."""
    env: dict[int, object] = {}
    for a, x in zip(node.args, args):
        if isinstance(a, Value):
            env[id(a)] = torch.tensor(x, dtype=a.dtype) if isinstance(a.dtype, torch.dtype) else x
    reference.run_node(node, env)
    r = env[id(node.outputs[0])]
    return typed_number(r.item() if isinstance(r, torch.Tensor) else r, node.outputs[0].dtype)
