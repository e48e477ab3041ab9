"""The reference backend: runs region nodes with torch ops, on any device and any strides.

It is the ground truth the CuTe kernels are tested against, the fallback for any segment a
kernel template cannot run, and the CPU backend the whole test-suite exercises. Semantics
follow thunder's prims (for example integer ``div`` truncates, ``sum`` over no dims is the
identity), and every result is cast to the dtype thunder's meta function inferred.
"""

from __future__ import annotations

from numbers import Number

import torch

from thunder_fuser.ir.region import Node, Value, map_values
from thunder_fuser.ir.torch_impls import REFERENCE_IMPLS


def _conform(result, value: Value):
    """Cast to the dtype thunder inferred: torch promotes Python scalars differently."""
    if isinstance(result, torch.Tensor) and isinstance(value.dtype, torch.dtype) and result.dtype != value.dtype:
        return result.to(value.dtype)
    if not isinstance(result, torch.Tensor) and isinstance(value.dtype, type) and isinstance(result, Number):
        return value.dtype(result)
    return result


def run_node(node: Node, env: dict[int, object]):
    """Run ``node`` reading its inputs from ``env`` (keyed by ``id(Value)``); store outputs."""
    lookup = lambda v: env[id(v)]  # noqa: E731
    args = map_values(node.args, lookup)
    kwargs = {k: map_values(v, lookup) for k, v in node.kwargs.items()}
    result = REFERENCE_IMPLS[node.op](*args, **kwargs)
    if len(node.outputs) == 1 and not (node.op == "update_aliases"):
        env[id(node.outputs[0])] = _conform(result, node.outputs[0])
    else:
        for out, r in zip(node.outputs, result):
            env[id(out)] = _conform(r, out)


def run_nodes(nodes, env: dict[int, object]) -> None:
    for node in nodes:
        run_node(node, env)
