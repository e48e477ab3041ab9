"""thunder's prologue checks as one call: fewer host microseconds in every step.

Before each call runs its computation, thunder's prologue checks every input against what
the trace was made for: each tensor's shape, device, dtype and ``requires_grad``, and each
number read from the module (its config, ``training`` flags, ``nn.Embedding``'s options)
against its value, one call through thunder's Python executor apiece. A decode step of
litgpt's Llama cut to 4 layers checks 203 numbers and 44 tensors a step: 194 us of a 2.9
ms step on the CPU machine, where a one-token step on the H100 is bound by the host.

``FastPrologue`` is a thunder transform (``thunder_fuser.transforms()``; pass it to
``thunder.jit(..., transforms=...)``). Before thunder builds the prologue, it takes those
checks out and puts one ``fuser_check_inputs`` in their place, just before the prologue
returns (after every value it checks has been unpacked); the checks it replaces are its
subsymbols, so the prologue trace still prints each one under it. The call compares all
the numbers' types and values and all the tensors' metadata as lists, in C; on any
difference it runs thunder's own checks in their order, so the error is thunder's, naming
the value (and thunder's cache goes on to its next entry, as before). Checks it cannot
batch stay as they were: a number against NaN (equal to itself only by thunder's rule),
a shape with symbolic sizes.
"""

from __future__ import annotations

import itertools
import operator

import torch
from thunder.core import prims
from thunder.core.compile_data import get_compile_data
from thunder.core.proxies import NumberProxy
from thunder.core.trace import from_trace, TraceProvenance
from thunder.core.transform_common import Transform
from thunder.executors.pythonex import (
    _check_number_type_and_value_impl,
    _check_tensor_shape_and_metadata_impl,
)
from thunder.extend import OperatorExecutor

prologue_ex = OperatorExecutor("fuser_prologue")

_META = operator.attrgetter("shape", "device", "dtype", "requires_grad")
_TENSOR = itertools.repeat(torch.Tensor)  # isinstance's second argument, for map


class _Expected:
    """What one prologue's batched checks expect, and thunder's checks to explain a miss."""

    def __init__(self, tensor_checks: list[tuple], number_checks: list[tuple]):
        self.metas = [(tuple(shape), torch.device(device), dtype, rg) for shape, device, dtype, rg in tensor_checks]
        self.tensor_checks = tensor_checks
        self.types = [type(v) for v in number_checks]
        self.values = list(number_checks)

    def explain(self, tensors: list, numbers: list) -> None:
        """thunder's checks, in order: the first that fails raises thunder's error."""
        for t, check in zip(tensors, self.tensor_checks):
            _check_tensor_shape_and_metadata_impl(t, *check)
        for n, v in zip(numbers, self.values):
            _check_number_type_and_value_impl(n, v)


_EXPECTED: list[_Expected] = []  # by the key a prologue's call carries


def _check_inputs(key: int, tensors: list, numbers: list) -> None:
    e = _EXPECTED[key]
    if (list(map(type, numbers)) != e.types or numbers != e.values or not all(map(isinstance, tensors, _TENSOR))
            or list(map(_META, tensors)) != e.metas):
        e.explain(tensors, numbers)


def _meta(key: int, tensors: list, numbers: list) -> None:
    return None


check_inputs = prologue_ex.register_operator(
    "fuser_check_inputs", meta=_meta, fn=_check_inputs, tags=(prims.OpTags.DONT_DCE,))


def _batchable(bsym) -> bool:
    if bsym.sym.id == prims.PrimIDs.CHECK_TENSOR_SHAPE_AND_METADATA:
        return all(type(s) is int for s in bsym.args[1])
    if bsym.sym.id == prims.PrimIDs.CHECK_NUMBER_TYPE_AND_VALUE:
        n, v = bsym.args
        return isinstance(n, NumberProxy) and v == v  # NaN equals itself only by thunder's rule
    return False


def batch_checks(prologue):
    """``prologue`` with its batchable checks replaced by one ``fuser_check_inputs`` before
    its return (the same trace where there is nothing to batch)."""
    moved = [b for b in prologue.bound_symbols if _batchable(b)]
    if len(moved) < 2:
        return prologue
    tensors = [b for b in moved if b.sym.id == prims.PrimIDs.CHECK_TENSOR_SHAPE_AND_METADATA]
    numbers = [b for b in moved if b.sym.id == prims.PrimIDs.CHECK_NUMBER_TYPE_AND_VALUE]
    key = len(_EXPECTED)
    _EXPECTED.append(_Expected([tuple(b.args[1:]) for b in tensors], [b.args[1] for b in numbers]))
    call = check_inputs.bind(key, [b.args[0] for b in tensors], [b.args[0] for b in numbers], output=None,
                             subsymbols=moved)
    ids = {id(b) for b in moved}
    kept = [b for b in prologue.bound_symbols if id(b) not in ids]
    at = next((i for i, b in enumerate(kept) if b.sym.id == prims.PrimIDs.RETURN), len(kept))
    out = from_trace(prologue)
    out.bound_symbols = kept[:at] + [call] + kept[at:]
    out.set_provenance(TraceProvenance(f"fuser: {len(moved)} input checks as one call"))
    return out


def _rewrites_the_prologue(t: Transform) -> bool:
    return (type(t).transform_traces_pre_prologue is not Transform.transform_traces_pre_prologue
            and not isinstance(t, (FastPrologue, _BatchLast)))


class FastPrologue(Transform):
    """Batches the prologue's input checks (module docstring).

    It must batch the prologue as the last transform leaves it: a transform after it that
    rewrites the checks (thunder's FSDP gives each sharded parameter its shard's shape;
    ``fsdp(thunder.jit(model, transforms=transforms()))`` puts FSDP after us) would not find
    them inside ``fuser_check_inputs``, which would then expect the unsharded shapes. Where
    such a transform follows, this one batches nothing and puts a batching step at the end
    of the function's transforms, once (thunder runs the list in order and reads its length
    as it goes)."""

    def __init__(self):
        self._last = _BatchLast()

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        cd = get_compile_data()
        transforms = getattr(cd, "transforms", None) or []
        at = next((i for i, t in enumerate(transforms) if t is self), None)
        if at is not None and any(_rewrites_the_prologue(t) for t in transforms[at + 1:]):
            if not any(t is self._last for t in transforms):
                transforms.append(self._last)
            return prologue_trace, computation_trace, epilogue_trace
        return batch_checks(prologue_trace), computation_trace, epilogue_trace


class _BatchLast(Transform):
    """``FastPrologue``'s batching, run after every transform that rewrites the prologue."""

    def transform_traces_pre_prologue(self, prologue_trace, computation_trace, epilogue_trace, **kwargs):
        return batch_checks(prologue_trace), computation_trace, epilogue_trace
