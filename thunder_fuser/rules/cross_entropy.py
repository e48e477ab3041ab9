"""Cross-entropy over classes (and ``nll_loss``) as ops fuser_ex owns, with their own
forward and backward rules.

thunder 0.2.6 decomposes ``F.cross_entropy`` into ``log_softmax``, ``take_along_dim`` and
``nll_loss_backward`` (ATen's, which fails for ``reduction="sum"`` of fp32 logits: "expected
scalar type Float but found Double"), so the loss stores an fp32 ``[tokens, classes]``
log-softmax and its gradient. Here both passes are written in the prims our kernels fuse:

* forward, one pass over each row (a row kernel; a row too long for registers takes the
  max and the sum of exp(x - max) online): the row's logsumexp, the target's logit (a
  compare of each column index with the target, summed: no gather) and, with label
  smoothing or class weights, the row's weighted sum of logits and the target's weight.
  What is saved for backward is per row: the fp32 logsumexp, the target, its weight;
* backward, one pointwise pass over the logits: ``grad = p * (A + B * W) - A * onehot -
  B * w`` with ``p = exp(x - lse)``, per-row scales ``A`` and ``B`` (the cotangent, the
  reduction's denominator, the target's weight, the smoothing), written in the logits'
  dtype;
* the reduction over rows (sum or mean) reads the per-row losses: ``tokens`` numbers, not
  the logits.

Class-index targets of any integer dtype; logits 1-D or 2-D, fp16/bf16/fp32/fp64, any
strides. Probability targets and more than two dims are left to thunder's decomposition.
The formulas follow ATen's ``cross_entropy_loss_label_smoothing``: a mean divides both the
nll term and the smoothing term by the rows not ignored, weighted by their targets' weights.
"""

from __future__ import annotations

import torch
import thunder.torch as ltorch
from thunder.core import dtypes, prims
from thunder.core.prims import get_grad, put_grad
from thunder.core.proxies import TensorProxy

_LOGIT_DTYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)


def _is_tensor(x) -> bool:
    return isinstance(x, TensorProxy)


def _class_index_problem(a, target, weight, size_average, reduce, reduction) -> bool:
    """Logits ``[N, C]`` or ``[C]`` with integer targets ``[N]`` or ``[]``, on one device."""
    if not (_is_tensor(a) and _is_tensor(target)) or size_average is not None or reduce is not None:
        return False
    if reduction not in ("none", "sum", "mean") or a.ndim not in (1, 2) or a.numel == 0:
        return False
    if dtypes.to_dtype(a.dtype) not in _LOGIT_DTYPES or not dtypes.is_exact_dtype(dtypes.to_dtype(target.dtype)):
        return False
    if dtypes.to_dtype(target.dtype) is dtypes.bool8 or tuple(target.shape) != tuple(a.shape[:-1]):
        return False
    if target.device != a.device:
        return False
    if weight is not None and not (_is_tensor(weight) and weight.ndim == 1 and weight.shape[0] == a.shape[-1]
                                   and weight.device == a.device
                                   and dtypes.to_dtype(weight.dtype) in _LOGIT_DTYPES):
        return False
    return True


def cross_entropy_checker(a, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                          reduction="mean", label_smoothing=0.0) -> bool:
    return _class_index_problem(a, target, weight, size_average, reduce, reduction) and 0.0 <= label_smoothing <= 1.0


def nll_loss_checker(a, target, weight=None, ignore_index=None, reduction="mean") -> bool:
    return _class_index_problem(a, target, weight, None, None, reduction)


def _nll_ignore_index(ignore_index):
    """ltorch.nll_loss receives None where the caller gave no ignore_index: torch's default."""
    return -100 if ignore_index is None else ignore_index


class _Rows:
    """The per-row pieces of a class-index loss over logits or log-probabilities ``x``
    (``[N, C]``, fp32), from one pass over each row."""

    def __init__(self, a, target, weight, ignore_index: int):
        self.vector = a.ndim == 1  # one row: [C] logits, [] target
        a2 = ltorch.unsqueeze(a, 0) if self.vector else a
        t2 = ltorch.unsqueeze(target, 0) if self.vector else target
        self.n, self.c = a2.shape
        # the per-row values first, then the logits' upcast: the segmenter puts a node in the
        # segment of its latest producer, so the row kernel over x must come after them
        t = ltorch.to(t2, dtypes.int64)
        valid = ltorch.ne(t, ignore_index)
        self.valid = ltorch.to(valid, dtypes.float32)  # [N]
        # the target's column as a compare per element (a row kernel reads the one element
        # instead: backends/cute/families/rows._target_picks), in 32 bits where the classes allow: 64-bit
        # integer arithmetic takes several instructions per element. A row that does not
        # count compares with -1, which no column is. The index is computed over the
        # broadcast targets, [N, C], so that it is work of the row kernel over the logits
        # (evaluated once per row there) rather than a segment of its own, which would keep
        # the row kernel from joining the logits' other reductions wherever thunder orders
        # it first
        index_dtype = dtypes.int32 if self.c < 2**31 else dtypes.int64
        tb = ltorch.expand(ltorch.unsqueeze(t, 1), (self.n, self.c))
        index = ltorch.to(ltorch.where(ltorch.ne(tb, ignore_index), tb, -1), index_dtype)
        columns = ltorch.arange(self.c, device=a.device, dtype=index_dtype)
        self.hit = ltorch.eq(ltorch.unsqueeze(columns, 0), index)  # [N, C] bool
        self.x = ltorch.to(a2, dtypes.float32)
        self.w = None if weight is None else ltorch.to(weight, dtypes.float32)  # [C]

    def picked(self, values):
        """Per row, ``values`` at the target's column (0 where the target is no column)."""
        return ltorch.sum(ltorch.where(self.hit, values, 0.0), 1)

    def target_weight(self):
        """Per row, the target's class weight times whether the row counts (``[N]``)."""
        if self.w is None:
            return self.valid
        return ltorch.mul(self.picked(ltorch.unsqueeze(self.w, 0)), self.valid)


def _reduced(per_row, reduction: str, denominator, vector: bool):
    if reduction == "none":
        return ltorch.squeeze(per_row, 0) if vector else per_row
    total = ltorch.sum(per_row)
    return total if reduction == "sum" else ltorch.true_divide(total, denominator)


def _cross_entropy_parts(a, target, weight, ignore_index, reduction, label_smoothing):
    """(loss in fp32, what backward needs)."""
    rows = _Rows(a, target, weight, ignore_index)
    wt = rows.target_weight()  # [N]
    # the rows that count, weighted (nll_loss's denominator), from the targets alone: the
    # segmenter runs it ahead of the row kernel over the logits (``segmenter._hoist_per_row_values``),
    # which may then scale the gradient it writes by it (``cross_entropy_grad``)
    count = ltorch.sum(wt)
    # the target's logit first: the segmenter then has a row reduction of x to add the
    # logsumexp's max to (a row kernel over x), where the compare alone is a pointwise segment
    picked = rows.picked(rows.x)
    lse = ltorch.logsumexp(rows.x, 1)  # [N]; its max and sum taken online
    nll = ltorch.mul(ltorch.sub(lse, picked), wt)
    eps = float(label_smoothing)
    if eps == 0.0:
        loss = _reduced(nll, reduction, count, rows.vector)
        return loss, (rows, lse, wt, count, None)
    if rows.w is None:
        total_w, weighted_x = float(rows.c), ltorch.sum(rows.x, 1)
    else:
        total_w = ltorch.sum(rows.w)
        weighted_x = ltorch.sum(ltorch.mul(rows.x, ltorch.unsqueeze(rows.w, 0)), 1)
    smooth = ltorch.mul(ltorch.sub(ltorch.mul(lse, total_w), weighted_x), rows.valid)
    # both terms' means divide by the rows that count, weighted (as ATen's label smoothing does)
    loss = ltorch.add(
        ltorch.mul(_reduced(nll, reduction, count, rows.vector), 1.0 - eps),
        ltorch.mul(_reduced(smooth, reduction, count, rows.vector), eps / rows.c),
    )
    return loss, (rows, lse, wt, count, total_w)


def cross_entropy_forward(a, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                          reduction="mean", label_smoothing=0.0):
    """The loss without a backward (inference, or where no gradient flows to the logits)."""
    loss, _ = _cross_entropy_parts(a, target, weight, ignore_index, reduction, label_smoothing)
    return ltorch.to(loss, a.dtype)


def _row_cotangent(g, reduction: str, rows: _Rows):
    """The cotangent per row (``[N, 1]``, fp32) of a loss reduced by ``reduction``."""
    g = ltorch.to(g, dtypes.float32)
    if reduction == "none":
        g = ltorch.unsqueeze(g, 0) if rows.vector else g
        return ltorch.unsqueeze(g, 1)
    return ltorch.expand(ltorch.reshape(g, (1, 1)), (rows.n, 1))


def cross_entropy_grad(a, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                       reduction="mean", label_smoothing=0.0):
    """Three passes over the logits where the loss is per row (``reduction="none"``: the
    cotangent is a row's, so the backward computes the gradient from the logits again); two
    where it is reduced to one number: the forward writes the gradient for a cotangent of
    one, in the logits' dtype, while it has the row (``scale_unless_one`` is the backward)."""
    # a mean's gradient needs the number of rows that count before the row kernel writes it:
    # counted ahead, from the targets alone; with class weights that count is a pass over
    # the rows of its own, so a weighted mean keeps three passes
    two_pass = reduction == "sum" or (reduction == "mean" and weight is None)
    loss, (rows, lse, wt, count, total_w) = _cross_entropy_parts(
        a, target, weight, ignore_index, reduction, label_smoothing)
    out = ltorch.to(loss, a.dtype)
    eps = float(label_smoothing)
    if not two_pass:
        _note_symbol[0](_three_passes_why(reduction))
        g = _row_cotangent(get_grad(out), reduction, rows)  # [N, 1]
        # the backward computes the fp32 logits and the compare again from the logits and the
        # targets: saved, they would be [N, C] (fp32 and bool) where the rows' statistics are [N]
        rows = _Rows(a, target, weight, ignore_index)
        grad = ltorch.to(_logits_gradient(rows, lse, wt, count, total_w, reduction, eps, g), a.dtype)
    else:
        ones = _logits_gradient(rows, lse, wt, count, total_w, reduction, eps, None)
        # the cotangent as it comes (a reshape here would be a region call a step of its own)
        grad = _scale_unless_one(ltorch.to(ones, a.dtype), get_grad(out))
    put_grad(a, ltorch.squeeze(grad, 0) if rows.vector else grad)
    return out


def _per_row_mean(scale, count):
    """A row's share of a mean, ``scale / count`` (``[N, 1]``), zero where the row's scale is:
    where no row counts (every target ignored) the loss is 0 / 0 = nan, as torch's, but its
    gradient is zero, as torch's. The division stays a node reading the rows and the count
    (the segmenter then hoists the count ahead of the row kernel: ``_hoist_per_row_values``)."""
    return ltorch.where(ltorch.eq(scale, 0.0), 0.0, ltorch.true_divide(scale, count))


def _logits_gradient(rows: _Rows, lse, wt, count, total_w, reduction: str, eps: float, g):
    """The loss's gradient over the logits, fp32 ``[N, C]``, for the row cotangents ``g``
    (``[N, 1]``; None: one)."""
    def times_g(v):
        return v if g is None else ltorch.mul(g, v)

    p = ltorch.exp(ltorch.sub(rows.x, ltorch.unsqueeze(lse, 1)))  # softmax, [N, C]
    nll_scale = ltorch.unsqueeze(wt, 1)  # [N, 1]: the target's weight where the row counts
    if reduction == "mean":
        nll_scale = _per_row_mean(nll_scale, count)
    a_scale = times_g(nll_scale if eps == 0.0 else ltorch.mul(nll_scale, 1.0 - eps))
    onehot = ltorch.to(rows.hit, dtypes.float32)
    if eps == 0.0:
        return ltorch.mul(ltorch.sub(p, onehot), a_scale)
    b_scale = times_g(ltorch.unsqueeze(rows.valid, 1))
    b_scale = ltorch.mul(b_scale, eps / rows.c)
    if reduction == "mean":
        b_scale = _per_row_mean(b_scale, count)
    w = 1.0 if rows.w is None else ltorch.unsqueeze(rows.w, 0)
    return ltorch.sub(
        ltorch.sub(ltorch.mul(p, ltorch.add(a_scale, ltorch.mul(b_scale, total_w))), ltorch.mul(onehot, a_scale)),
        ltorch.mul(b_scale, w),
    )


def nll_loss_forward(a, target, weight=None, ignore_index=None, reduction="mean"):
    ignore_index = _nll_ignore_index(ignore_index)
    rows = _Rows(a, target, weight, ignore_index)
    wt = rows.target_weight()
    loss = _reduced(ltorch.neg(ltorch.mul(rows.picked(rows.x), wt)), reduction, ltorch.sum(wt), rows.vector)
    return ltorch.to(loss, a.dtype)


def nll_loss_grad(a, target, weight=None, ignore_index=None, reduction="mean"):
    ignore_index = _nll_ignore_index(ignore_index)
    rows = _Rows(a, target, weight, ignore_index)
    wt = rows.target_weight()
    count = ltorch.sum(wt)
    out = ltorch.to(_reduced(ltorch.neg(ltorch.mul(rows.picked(rows.x), wt)), reduction, count, rows.vector), a.dtype)
    g = _row_cotangent(get_grad(out), reduction, rows)
    rows = _Rows(a, target, weight, ignore_index)  # the compare again, not saved
    scale = ltorch.unsqueeze(wt, 1)
    if reduction == "mean":
        scale = _per_row_mean(scale, count)
    grad = ltorch.neg(ltorch.mul(ltorch.to(rows.hit, dtypes.float32), ltorch.mul(g, scale)))
    grad = ltorch.to(grad, a.dtype)
    put_grad(a, ltorch.squeeze(grad, 0) if rows.vector else grad)
    return out


SCALE_UNLESS_ONE = "fuser_scale_unless_one"
LOSS_NOTE = "fuser_loss_note"
STANDALONE = frozenset((SCALE_UNLESS_ONE, LOSS_NOTE))  # registered ops never fused into a region
_scale_symbol: list = []  # the symbol, made by ``register``
_note_symbol: list = []  # likewise


def _three_passes_why(reduction: str) -> str:
    """Why the loss reads its logits again in the backward (the trace says it there)."""
    if reduction == "none":
        return ("cross_entropy: three passes over the logits (the backward reads them again and writes the"
                " gradient): the loss is per row (reduction='none'), so each row's cotangent is known only here")
    return ("cross_entropy: three passes over the logits (the backward reads them again and writes the gradient):"
            " a mean weighted by class weights divides by the targets' summed weights, a pass over the rows of"
            " its own before any gradient could be written in the forward")


def _note_meta(text: str) -> None:
    return None


def _print_note(bsym, out_printables, arg_printables, kwarg_printables) -> str:
    """A comment line in the trace; nothing runs (``prims.comment`` does not survive DCE)."""
    return f"# {bsym.args[0]}"


def _scale_unless_one(grad, g):
    return _scale_symbol[0](grad, g)


def _scale_meta(grad, g):
    return TensorProxy(like=grad)


def _scale_impl(grad, g):
    """The saved gradient scaled in place. A second backward through the same graph
    (``backward(retain_graph=True)``, then again) finds it scaled by the first one's
    cotangent already: it scales by the new cotangent over that one (on the device, no host
    sync). The tensor remembers its scale on itself (torch keeps a tensor's Python object,
    attributes included, while autograd holds it). Its version counter is kept: the write is
    the rule's own, not a user's change of a saved tensor."""
    from thunder_fuser.backends.cute.backend import cute_on
    from thunder_fuser.backends.cute.families.scale_unless_one import scale_unless_one_

    applied = getattr(grad, _APPLIED, None)
    with torch.autograd._unsafe_preserve_version_counter(grad):
        if applied is None:
            scale_unless_one_(grad, g, use_kernel=cute_on(grad.device.type))
        else:  # rare: torch's ops, one rounding of the product as the kernel's
            wide = torch.float64 if grad.dtype == torch.float64 else torch.float32
            grad.copy_(grad.to(wide) * (g.to(wide) / applied.to(wide)).reshape(()))
    setattr(grad, _APPLIED, g)  # kept as it is (a clone would be a launch a step): autograd made it
    return grad


_APPLIED = "_thunder_fuser_scaled_by"  # the cotangent a saved loss gradient holds


def _print_scale(bsym, out_printables, arg_printables, kwarg_printables) -> str:
    """Says what the op is for where a user reads the backward trace."""
    from thunder.core import codeutils

    pp = codeutils.prettyprint
    grad, g = arg_printables
    return (f"{pp(out_printables, literals_as_underscores=True)} = fuser_scale_unless_one({pp(grad)}, {pp(g)})"
            "  # the loss's gradient, written by its forward for a cotangent of one (two passes over the"
            " logits): scaled in place unless the cotangent is one, which the device checks")


def register(executor) -> frozenset:
    """Claim ``cross_entropy`` and ``nll_loss`` for ``executor`` with these rules; their ids."""
    if not _scale_symbol:
        _scale_symbol.append(executor.register_operator(
            SCALE_UNLESS_ONE, meta=_scale_meta, fn=_scale_impl, python_printer=_print_scale))
        _note_symbol.append(executor.register_operator(
            LOSS_NOTE, meta=_note_meta, fn=_note_meta, python_printer=_print_note, tags=[prims.OpTags.DONT_DCE]))
    executor.register_supported(ltorch.cross_entropy, cross_entropy_checker,
                                execution_transform=cross_entropy_forward, grad_transform=cross_entropy_grad)
    executor.register_supported(ltorch.nll_loss, nll_loss_checker,
                                execution_transform=nll_loss_forward, grad_transform=nll_loss_grad)
    return frozenset((ltorch.cross_entropy.id, ltorch.nll_loss.id))
