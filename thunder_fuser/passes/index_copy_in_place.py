"""A KV cache's ``index_copy_`` written in place again, as the program wrote it.

thunder functionalizes ``cache.index_copy_(dim, pos, k)`` (litgpt's KV cache, the seed's
decode step) into ``r = index_copy(cache, dim, pos, k)``, an out-of-place copy of the whole
cache by torch, then ``copy_(r, cache)``, the whole cache copied back by a region of ours:
per cache and step an allocation of the cache's size, three launches and two passes over
it, where the program asked for one small write. At batch-1 decoding each is host time: a
Llama-3.2-1B step cut to 4 layers has 8 such pairs.

``in_place_index_copies`` turns each such pair back into one ``fuser_index_copy_`` (torch's
``Tensor.index_copy_`` on the cache, which returns it) and the ``copy_`` into a
``shallow_copy`` of its result (a view: what the ``copy_`` returned, the cache now written).
Only where nothing can tell: the ``copy_`` is the very next op, writes the ``index_copy``'s
own base, and is the only reader of its result; so no read of the cache's old value is
moved past the write. A source that overlaps the cache is refused by torch's
``index_copy_`` with its error, as eager's is (thunder's functional form would have read it
before the write).
"""

from __future__ import annotations

from thunder.core import prims
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, from_trace
from thunder.extend import OperatorExecutor, register_executor

in_place_ex = OperatorExecutor("fuser_in_place", version="0.1")
register_executor(in_place_ex)


def _index_copy_(a, dim, index, source):
    return a.index_copy_(dim, index, source)


def _meta(a, dim, index, source):
    return TensorProxy(like=a)


# IN_PLACE: the fusion pass's guards (rematerialization, donation, views stored as copies)
# see a trace that writes in place; DONT_DCE: the write stays where its result is unread
index_copy_ = in_place_ex.register_operator("fuser_index_copy_", meta=_meta, fn=_index_copy_,
                                            tags=(OpTags.IN_PLACE, OpTags.DONT_DCE))


def _is_index_copy(b) -> bool:
    return b.sym.name == "index_copy" and len(b.args) == 4 and not b.kwargs and isinstance(b.output, TensorProxy)


def _tensor_names(b) -> set[str]:
    return {p.name for p in b.flat_proxy_args if isinstance(p, TensorProxy)}


def in_place_index_copies(trace: TraceCtx) -> TraceCtx:
    """``trace`` with each ``index_copy`` + ``copy_`` back into its base written in place
    (module docstring); ``trace`` itself where there is none."""
    bsyms = list(trace.bound_symbols)
    readers: dict[str, int] = {}
    for b in bsyms:
        for name in _tensor_names(b):
            readers[name] = readers.get(name, 0) + 1
    changed = False
    for i in range(len(bsyms) - 1):
        b, c = bsyms[i], bsyms[i + 1]
        if not _is_index_copy(b) or c.sym.id != prims.PrimIDs.COPY_:
            continue
        base, result = b.args[0], b.output
        src, dst = c.args[0], c.args[1]
        if not (isinstance(src, TensorProxy) and isinstance(dst, TensorProxy) and isinstance(base, TensorProxy)):
            continue
        if src.name != result.name or dst.name != base.name or readers.get(result.name) != 1:
            continue
        if any(isinstance(x, TensorProxy) and x.name == base.name for x in b.args[2:]):
            continue  # the index or the source is the cache itself
        bsyms[i] = index_copy_.bind(*b.args, output=result)
        bsyms[i + 1] = prims.shallow_copy.bind(result, output=c.output)
        changed = True
    if not changed:
        return trace
    out = from_trace(trace)
    out.bound_symbols = bsyms
    return out
