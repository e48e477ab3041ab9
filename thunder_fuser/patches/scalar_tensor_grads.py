"""The gradient of a 0-d tensor that an elementwise op broadcast is summed.

thunder's elementwise prims take a 0-d tensor beside a tensor with dims without broadcasting
it (as a number), and their grad rules (``thunder/core/transforms.py``: ``_mul_prim_grad``
and the others) hand the 0-d operand ``g * other``, a tensor of the other's shape, traced
as if it were 0-d. Where the 0-d tensor is an input, torch's autograd sums the gradient to
its shape after the backward; where it is computed in the function, the backward goes on
with the unsummed tensor: thunder 0.2.6 with its default executors differentiates
``b * b.sum()`` wrongly (1.8 off in a [5, 3] float64 gradient), and ``b + b.sum() * -1.5``
gives -7.5 where torch gives -322.5. An executor that lays out the traced shape fails
instead. Here each gradient a grad rule puts on a 0-d tensor from one with dims is summed
first, for every thunder function in the process."""

from __future__ import annotations

from thunder_fuser.patches.wrap import wrap_once


def sum_scalar_tensor_grads() -> bool:
    """Wrap the ``put_grad`` thunder's grad rules call; False where thunder is not as expected."""
    try:
        from thunder.core import transforms
        from thunder.core.proxies import TensorProxy
    except ImportError:
        return False

    def wrap(put_grad):
        def summed_put_grad(a, g):
            if isinstance(a, TensorProxy) and isinstance(g, TensorProxy) and a.ndim == 0 and g.ndim > 0:
                import thunder.torch as ltorch

                g = ltorch.to(ltorch.sum(g), a.dtype)
            return put_grad(a, g)

        return summed_put_grad

    return wrap_once(transforms, "put_grad", wrap)
