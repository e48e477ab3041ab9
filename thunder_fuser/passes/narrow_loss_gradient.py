"""The two-pass cross-entropy's gradient stored in the logits' own dtype, where the loss
reads them through an upcast (``F.cross_entropy(logits.float(), t)``).

The loss's rule (``rules/cross_entropy.py``) sees only the fp32 tensor it is given, so its
forward writes the gradient in fp32, and the upcast's backward narrows it after
``fuser_scale_unless_one``: an fp32 ``[tokens, vocab]`` stored between the passes and one
more pass over it. thunder hands the fusion pass the joint forward-backward trace, where the
narrowing is visible: this pass moves it into the forward (the row kernel writes the narrow
gradient) and lets ``fuser_scale_unless_one`` produce the narrowed tensor itself. For a
cotangent of one the result is eager's (the fp32 gradient rounded once); otherwise the
gradient is rounded before it is scaled.
"""

from __future__ import annotations

from thunder.core import dtypes, prims, utils
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, from_trace, tracectx

from thunder_fuser.rules.cross_entropy import SCALE_UNLESS_ONE

_CONVERTS = ("convert_element_type", "to")
_VIEWS = ("reshape", "view", "squeeze", "unsqueeze", "flatten")


def _views_then_narrowing(t, consumers, returned):
    """The view ops that ``t`` alone goes through, each read only by the next, then the
    conversion to a narrower float dtype that reads the last of them: (views, conversion),
    or ([], None) where ``t`` goes elsewhere."""
    views = []
    while True:
        users = consumers.get(t, [])
        if len(users) != 1 or t.name in returned:
            return [], None
        (u,) = users
        if u.sym.name in _VIEWS and u.args and u.args[0] is t and isinstance(u.output, TensorProxy):
            views.append(u)
            t = u.output
            continue
        y = u.output
        if (u.sym.name in _CONVERTS and isinstance(y, TensorProxy) and dtypes.is_float_dtype(y.dtype)
                and y.dtype.bytes < t.dtype.bytes):
            return views, u
        return [], None


def narrow_loss_gradients(trace: TraceCtx) -> TraceCtx:
    """``trace`` with each ``fuser_scale_unless_one`` whose result is narrowed (through
    views, each read only by the next: transformers upcasts ``[b, s, vocab]`` and flattens
    it after) reading the narrowed gradient instead; ``trace`` itself where there is none."""
    bsyms = list(trace.bound_symbols)
    if not any(b.sym.id == SCALE_UNLESS_ONE for b in bsyms):
        return trace
    producers, consumers = utils.producers_and_consumers(trace)
    returned = {p.name for b in bsyms if b.sym.id == prims.PrimIDs.RETURN for p in b.flat_proxy_args}
    out = from_trace(trace)
    insert_after: dict[int, object] = {}  # id of a producer bsym -> the convert to put after it
    replace: dict[int, object] = {}  # id of a bsym -> its replacement (None: dropped)
    for b in bsyms:
        if b.sym.id != SCALE_UNLESS_ONE:
            continue
        grad, g = b.args
        views, narrow = _views_then_narrowing(b.output, consumers, returned)
        if narrow is None:
            continue
        y = narrow.output
        producer = producers.get(grad, None)
        if producer is None or len(consumers.get(grad, [])) != 1:
            continue
        with tracectx(out):
            narrowed = TensorProxy(like=grad, dtype=y.dtype)
            # the scale's result and each view's, narrow; the last view's is the conversion's
            chain = [narrowed] + [TensorProxy(like=u.output, dtype=y.dtype) for u in [b] + views[:-1]] + [y]
        if not views:
            chain = [narrowed, y]
        insert_after[id(producer)] = prims.convert_element_type.bind(grad, y.dtype, output=narrowed)
        replace[id(b)] = b.sym.bind(chain[0], g, output=chain[1])
        for i, v in enumerate(views):  # the same views, of the narrow tensor
            replace[id(v)] = v.sym.bind(chain[i + 1], *v.args[1:], **v.kwargs, output=chain[i + 2])
        replace[id(narrow)] = None
    if not replace:
        return trace
    new = []
    for b in bsyms:
        r = replace.get(id(b), b)
        if r is not None:
            new.append(r)
        if id(b) in insert_after:
            new.append(insert_after[id(b)])
    out.bound_symbols = new
    return out
