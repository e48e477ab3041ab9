"""The region IR: the one data structure every middle pass reads and writes.

A :class:`Region` is a straight-line program of :class:`Node` s over SSA :class:`Value` s.
It holds only plain Python and torch dtypes, never thunder proxies, so functionalize,
layout and segmentation are unit-tested without tracing anything (thunder types stay at
the edges: ``ir/from_thunder.py`` builds regions, ``executor.py`` emits them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import torch


@dataclass(eq=False)
class Value:
    """A tensor or a number flowing through a region.

    ``broadcast_dims`` are the dims whose elements all alias one element (stride 0 after a
    ``broadcast_in_dim``); a layout never lets such dims choose an output's order.
    ``allocation_order`` lists dims from outermost to innermost once the layout pass ran.
    """

    name: str
    shape: tuple[int, ...] = ()
    dtype: torch.dtype | type | None = None
    is_tensor: bool = True
    broadcast_dims: frozenset[int] = frozenset()
    allocation_order: tuple[int, ...] | None = None
    # laid out contiguously, as torch's kernel returns it (softmax's result; a reduction's,
    # also when it is rewritten into pointwise ops: ``small_reductions.py``)
    contiguous: bool = False
    # a conversion torch makes by ``.to()`` (a tensor, laid out as ``.to()`` lays it out): a
    # program's ``x.to(dtype)``, or an op's operand's conversion to the op's common dtype, which
    # the CPU's TensorIterator makes before the op; ``converted_first``: the conversion of
    # thunder's broadcast of the operand, where torch converts the operand, then broadcasts it
    materialized: bool = False
    converted_first: bool = False
    # the tensor whose memory this value stands for, where a write of it into that tensor was
    # elided (``functionalize/superseded.py``): eager's later reads see that tensor's strides
    laid_out_as: Value | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self) -> str:
        return self.name


@dataclass(eq=False)
class Node:
    """One prim application. ``args``/``kwargs`` mirror the prim's signature, with
    :class:`Value` s in place of proxies (possibly nested in tuples, as for ``cat``)."""

    op: str
    args: tuple
    kwargs: dict
    outputs: tuple[Value, ...]
    text: str = ""

    def inputs(self) -> list[Value]:
        """Distinct tensor and number values this node reads, in argument order."""
        seen: dict[int, Value] = {}
        for v in _walk(self.args):
            seen.setdefault(id(v), v)
        for v in _walk(tuple(self.kwargs.values())):
            seen.setdefault(id(v), v)
        return list(seen.values())

    def tensor_inputs(self) -> list[Value]:
        return [v for v in self.inputs() if v.is_tensor]

    @property
    def output(self) -> Value:
        return self.outputs[0]

    @property
    def written(self) -> Value:
        """The tensor a ``copy_`` or ``copy_to_out_`` writes into."""
        return self.args[1] if self.op == "copy_" else self.kwargs["out"]

    def __repr__(self) -> str:
        return self.text or f"{self.outputs} = {self.op}{self.args}"


def _walk(obj: Any) -> Iterator[Value]:
    if isinstance(obj, Value):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _walk(o)


def map_values(obj: Any, fn) -> Any:
    """Rebuild ``obj`` (nested tuples/lists) with every Value replaced by ``fn(value)``."""
    if isinstance(obj, Value):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_values(o, fn) for o in obj)
    if isinstance(obj, list):
        return [map_values(o, fn) for o in obj]
    return obj


@dataclass(eq=False)
class Region:
    """A claimed region: inputs, nodes in a valid order, and the values it must return.

    ``mutated`` maps a region input name to the node that writes it in place
    (``copy_to_out_``/``copy_``): such a write is an effect the region must perform even
    when nothing reads the returned value.
    """

    name: str
    inputs: list[Value]
    nodes: list[Node]
    outputs: list[Value]
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)
    grad_enabled: bool = False  # the user's grad mode when thunder traced the region
    rewritten_copies: set[str] = field(default_factory=set)  # trace names of copy_ now copy_to_out_
    # ``x.copy_(x)`` elided (nothing to write), still an in-place write to torch's eyes: a
    # leaf that requires grad raises
    self_copies: list = field(default_factory=list)
    # output name -> how a matmul after the region reads it (``layout/matmul_operands.py``)
    matmul_reads: dict[str, str] = field(default_factory=dict)
    # outputs attention after the region reads as [b, h, s, d] (``layout/attention_operands.py``)
    attention_reads: frozenset[str] = frozenset()
    # outputs whose aliasing nothing can observe (the trace writes nothing in place and does
    # not return them): a view among them may be stored as a copy (``plan/stored_views.py``)
    copyable_outputs: frozenset[str] = frozenset()
    # inputs nothing after the region reads, which an output may be written over where only
    # the trace holds them (``passes/dead_inputs.py``, ``runtime/donation.py``)
    dead_inputs: frozenset[str] = frozenset()

    def producers(self) -> dict[int, Node]:
        return {id(o): n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[int, list[Node]]:
        uses: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs():
                uses.setdefault(id(v), []).append(n)
        return uses

    def writes(self) -> list[Node]:
        return [n for n in self.nodes if n.op in ("copy_", "copy_to_out_")]
