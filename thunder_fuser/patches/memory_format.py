"""``Tensor.to(..., memory_format=...)`` laid out as torch lays it out.

thunder 0.2.6's ``to`` returns as soon as it has converted the dtype, so
``x.to(torch.float64, memory_format=torch.channels_last)`` lost the format, and without a
dtype it knows only the channels-last formats, so ``x.to(memory_format=torch.contiguous_format)``
of a channels-last ``x`` came back channels-last. thunder's torch executor hides this by
calling torch's ``to`` on the real tensors; an executor that runs the traced prims (ours,
nvFuser) returned the strides the trace said. torch: the result is in the format asked
for (the input itself where it already is, the dtype and device unchanged).

The symbol stays thunder's ``to`` (its name in every trace, the torch executor's call);
its function converts with no format and then takes ``ltorch.contiguous`` in the format,
a ``stride_order`` our kernels write in that layout. ``preserve_format`` keeps the
input's layout, as thunder did. ``tests/test_memory_format.py`` compares strides and
values with eager.
"""

from __future__ import annotations

import functools
import inspect


def lay_out_as_asked() -> bool:
    """Wrap the function of thunder's ``to`` symbol; False where thunder is not as expected."""
    import torch
    import thunder.torch as ltorch

    sym = getattr(ltorch, "to", None)
    meta = getattr(sym, "meta", None)
    if meta is None or "memory_format" not in inspect.signature(meta).parameters:
        return False
    if getattr(meta, "_thunder_fuser_patch", False):
        return True

    @functools.wraps(meta)
    def to(a, *args, memory_format=None, **kwargs):
        out = meta(a, *args, **kwargs)
        if memory_format is None or memory_format is torch.preserve_format:
            return out
        return ltorch.contiguous(out, memory_format=memory_format)

    to._thunder_fuser_patch = True
    object.__setattr__(sym, "meta", to)  # a frozen dataclass: its symbol is shared by every trace
    return True
