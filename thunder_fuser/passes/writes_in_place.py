"""A functional copy written back into its base, written in place again, as the program wrote it.

thunder functionalizes an in-place write into part of a tensor as an out-of-place copy of
the whole tensor with the part written, then ``copy_`` of that copy back into the tensor:
- ``cache.index_copy_(dim, pos, k)`` (litgpt's KV cache, the seed's decode step) becomes
  ``r = index_copy(cache, dim, pos, k)`` and ``copy_(r, cache)``: per cache and step an
  allocation of the cache's size, three launches and two passes over it, where the program
  asked for one small write (a Llama-3.2-1B decode step cut to 4 layers has 8 such pairs);
- ``m[i, a:b] = 0.0`` (``Tensor.__setitem__``) becomes ``r = copy_with_setitem(m, key,
  0.0)`` and ``copy_(r, m)``. A program that builds a mask row by row in a Python loop
  (litgpt's Gemma-2 sliding-window mask: ``T`` writes into a ``T x T`` mask, every
  sliding-window layer, every step) moved the whole mask twice per row written: at 2048
  tokens, 64 GB a layer for an 8 MB mask.

``functional_writes_in_place`` turns each such pair back into one write in place
(``fuser_index_copy_``: torch's ``Tensor.index_copy_``; ``fuser_setitem_``: torch's
``Tensor.__setitem__``; each returns the base) and the ``copy_`` into a ``shallow_copy`` of
its result (a view: what the ``copy_`` returned, the base now written). Only where nothing
can tell: the ``copy_`` is the very next op, writes the functional op's own base, and is the
only reader of its result; so no read of the base's old value is moved past the write. An
index or a value that is the base itself keeps the functional form. One that overlaps the
base otherwise is read as eager reads it, by the same torch op (both ``index_copy_`` and
``__setitem__`` refuse an overlapping source with eager's error).
"""

from __future__ import annotations

from thunder.core import prims
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.core.pytree import tree_flatten
from thunder.core.trace import TraceCtx, from_trace
from thunder.extend import OperatorExecutor, register_executor

in_place_ex = OperatorExecutor("fuser_in_place", version="0.1")
register_executor(in_place_ex)


def _index_copy_(a, dim, index, source):
    return a.index_copy_(dim, index, source)


def _setitem_(a, key, value):
    a[key] = value
    return a


def written_meta(a, *where_and_what):
    """A write in place returns its base."""
    return TensorProxy(like=a)


# IN_PLACE: the fusion pass's guards (rematerialization, donation, views stored as copies)
# see a trace that writes in place; DONT_DCE: the write stays where its result is unread
index_copy_ = in_place_ex.register_operator("fuser_index_copy_", meta=written_meta, fn=_index_copy_,
                                            tags=(OpTags.IN_PLACE, OpTags.DONT_DCE))
setitem_ = in_place_ex.register_operator("fuser_setitem_", meta=written_meta, fn=_setitem_,
                                         tags=(OpTags.IN_PLACE, OpTags.DONT_DCE))


def _in_place_form(b):
    """The write in place that functional ``b`` copies its base for, or None."""
    if b.kwargs or not isinstance(b.output, TensorProxy):
        return None
    if b.sym.name == "index_copy" and len(b.args) == 4:
        return index_copy_
    if b.sym.name in ("copy_with_setitem", "copy_with_setitem_impl") and len(b.args) == 3:
        return setitem_
    return None


def reader_counts(bsyms) -> dict[str, int]:
    """Tensor name -> how many ops of ``bsyms`` read it."""
    readers: dict[str, int] = {}
    for b in bsyms:
        for name in {p.name for p in b.flat_proxy_args if isinstance(p, TensorProxy)}:
            readers[name] = readers.get(name, 0) + 1
    return readers


def functional_writes_in_place(trace: TraceCtx) -> TraceCtx:
    """``trace`` with each functional write + ``copy_`` back into its base written in place
    (module docstring); ``trace`` itself where there is none."""
    bsyms = list(trace.bound_symbols)
    readers = reader_counts(bsyms)
    changed = False
    for i in range(len(bsyms) - 1):
        b, c = bsyms[i], bsyms[i + 1]
        form = _in_place_form(b)
        if form is None or c.sym.id != prims.PrimIDs.COPY_:
            continue
        base, result = b.args[0], b.output
        src, dst = c.args[0], c.args[1]
        if not (isinstance(src, TensorProxy) and isinstance(dst, TensorProxy) and isinstance(base, TensorProxy)):
            continue
        if src.name != result.name or dst.name != base.name or readers.get(result.name) != 1:
            continue
        if base.name in {p.name for p in tree_flatten(b.args[1:])[0] if isinstance(p, TensorProxy)}:
            continue  # the index or the value is the base itself
        bsyms[i] = form.bind(*b.args, output=result)
        bsyms[i + 1] = prims.shallow_copy.bind(result, output=c.output)
        changed = True
    if not changed:
        return trace
    out = from_trace(trace)
    out.bound_symbols = bsyms
    return out
