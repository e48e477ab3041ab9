"""thunder's torch implementation of ``nll_loss_backward`` fails, or returns the gradient in
another shape, for logits of 3 or more than 4 dims and for a summed loss.

thunder 0.2.6 (``executors/torchex.py``, ``_nll_loss_backward_impl``) views ``[N, C, d1...]``
logits as ``[N, C, 1, d]`` for ATen's ``nll_loss2d_backward`` and, for a reduced loss,
returns that ``[N, C, 1, d]`` tensor where the trace says ``[N, C, d1...]`` (a per-element
loss is reshaped to the targets' shape, also not the logits'). The next op of the backward
then broadcasts against the wrong shape: ``F.cross_entropy`` over ``[3, 10, 4]`` logits with
``[3, 4]`` targets (a per-position loss, as segmentation models take it) fails in the
backward, or worse, broadcasts. A per-element loss fails in ATen (its cotangent is reshaped
against targets of another rank), and a summed one of fp32 logits too: thunder passes a
float64 total weight where ATen wants the logits' dtype. Here logits of more than two dims
are taken as rows of classes (the class dim moved last, ATen's ``nll_loss_backward`` over
``[rows, C]``) and the gradient is handed back in the logits' shape."""

from __future__ import annotations

from thunder_fuser.patches.wrap import wrap_once


def reshape_to_the_logits() -> bool:
    """Wrap the implementation thunder's torch executor registered; False where thunder is
    not as expected."""
    try:
        from thunder.executors import torchex
    except ImportError:
        return False
    op = getattr(torchex, "nll_loss_backward", None)
    if op is None:
        return False

    def wrap(impl):
        def _nll_loss_backward_impl(g, a, /, target, weight, reduction, ignore_index, total_weight):
            import torch

            if total_weight is None:  # a summed loss: ATen reads it only for a mean, in the logits' dtype
                total_weight = torch.zeros((), dtype=a.dtype, device=a.device)
            if a.ndim <= 2:
                return impl(g, a, target, weight, reduction, ignore_index, total_weight)
            rows = a.movedim(1, -1)
            grad = impl(g.reshape(-1) if reduction == "none" else g, rows.reshape(-1, a.shape[1]), target.reshape(-1),
                        weight, reduction, ignore_index, total_weight)
            return grad.reshape(rows.shape).movedim(-1, 1)

        # the operator calls what its bind hook puts in each bound symbol's call context: the
        # one dict that hook closes over
        hook = getattr(op, "_bind_postprocess", None)
        for cell in getattr(hook, "__closure__", None) or ():
            ctx = cell.cell_contents
            if isinstance(ctx, dict) and ctx.get(op.name) is impl:
                ctx[op.name] = _nll_loss_backward_impl
        return _nll_loss_backward_impl

    return wrap_once(torchex, "_nll_loss_backward_impl", wrap)
