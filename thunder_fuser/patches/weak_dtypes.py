"""A tensor of one or more dims never has a weak dtype in thunder's metadata.

thunder gives a 0-d tensor a *weak* dtype (``bf16_``), as torch's type promotion ranks 0-d
tensors below tensors with dims. But thunder 0.2.6 makes every view's proxy ``like=`` its
operand, copying the operand's *true* dtype: ``a.reshape(1, 1)`` of a 0-d bf16 ``a`` is a
2-d tensor that still claims a weak dtype, so ``a.reshape(1, 1) + b`` with ``b`` a 0-d fp32
tensor is traced as fp32 where torch computes bf16 (``unsqueeze``, ``expand`` likewise).
thunder's torch executor hides it by calling ``torch.add`` on the real tensors; an executor
that runs the traced prims (ours, nvFuser) returns the traced dtype. The fix is where the
proxy is made: a proxy's true dtype is weak only where it has no dims, for every proxy in
the process (ours or not)."""

from __future__ import annotations

from thunder_fuser.patches.wrap import wrap_once


def strengthen_dims_dtypes() -> bool:
    """Wrap thunder's ``_infer_tensor_properties``; False where thunder is not as expected."""
    try:
        from thunder.core import dtypes, proxies
    except ImportError:
        return False

    def wrap(infer):
        def _infer_tensor_properties(*args, **kwargs):
            props = infer(*args, **kwargs)
            true_dtype, ndim = props[3], props[5]
            if ndim and dtypes.is_weak_dtype(true_dtype):
                props = props[:3] + (dtypes.to_strong_dtype(true_dtype),) + props[4:]
            return props

        return _infer_tensor_properties

    return wrap_once(proxies, "_infer_tensor_properties", wrap)
