"""Attention reads grouped-query K and V at their own heads, never expanded to the query's.

Grouped-query attention shares each K/V head between ``g`` query heads. The model code
users train (litgpt's ``repeat_interleave``, transformers' ``repeat_kv``) makes the sharing
explicit before SDPA: ``k[:, :, None].expand(b, hk, g, s, d).reshape(b, hk * g, s, d)``, so
a region writes K and V ``g`` times over, attention reads them so, the forward saves them so
for the backward, whose gradients come back at every query head and are summed over each
group (``reshape`` to ``[b, hk, g, s, d]``, ``sum`` over ``g``). Llama-3.2-1B (32 query
heads, 8 K/V heads, bf16) at 4096 tokens: expanded K and V are 32 MiB a layer where 8 hold
their values, written and read again in the forward, held from forward to backward, and
their gradients as much again, written by attention and read by the sum; falcon-7b's one
K/V head is expanded 71 times. torch's CPU flash kernels take K/V with fewer heads
(``hq % hk == 0``), map query head ``h`` to K/V head ``h // g`` (the expansion's own map)
and return K's and V's gradients at ``hk`` heads, summed over each group in fp32 and rounded
once (``tests/test_attention.py``). torch's dense cuDNN call does not refuse fewer K/V heads
either (pytorch/pytorch#139586), but no GPU has checked it here yet.

The rule, on the joint trace thunder hands the fusion pass. An attention forward whose K
and V are each the expansion above of a ``[b, hk, s, d]`` tensor (a ``contiguous()`` after
it changes no value) reads those tensors instead. A backward of that call whose K and V
gradients go only to the group sum reads them too, and writes the sums' own results; the
reshape and the sum go. The expansions' other readers, if any, keep them; a backward that
reads the expanded gradients elsewhere stays as it was (it reads the expanded K/V, still
made). K or V at its own heads that is a view of a larger tensor (litgpt's V, a slice of the
fused q/k/v projection) is copied to a tensor of its own (``_view_of_more``): attention and
its backward read the copy, and the projection is not held from forward to backward. On
CUDA it waits for a GPU run to check cuDNN's grouped call (``THUNDER_FUSER_GQA=1`` asks for
it: then where torch's own check admits cuDNN for that call); ``0`` turns it off. The trace
says so beside each attention call (``attention._print_grouped``).
"""

from __future__ import annotations

from collections.abc import Callable

from thunder.core import prims, utils
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, from_trace, tracectx
from thunder.core.transform_common import dce

FORWARD, BACKWARD = "fuser_attention_forward", "fuser_attention_backward"
_SAME_VALUES = ("contiguous", "stride_order")  # layout only: the expansion may end in one


def _source_of_expansion(t, producers) -> tuple[TensorProxy, int] | None:
    """(``k``, ``g``) where ``t`` is ``k [b, hk, s, d]`` with each head repeated ``g > 1``
    times in place (head ``h`` of ``t`` is head ``h // g`` of ``k``), else None."""
    p = producers.get(t, None)
    while p is not None and p.sym.name in _SAME_VALUES:
        p = producers.get(p.args[0], None)
    if p is None or p.sym.id != prims.PrimIDs.RESHAPE or t.ndim != 4:
        return None
    x = p.args[0]
    if not isinstance(x, TensorProxy) or x.ndim != 5:
        return None
    b, hk, g, s, d = x.shape
    if g < 2 or tuple(t.shape) != (b, hk * g, s, d):
        return None
    e = producers.get(x, None)
    if e is None or e.sym.id != prims.PrimIDs.BROADCAST_IN_DIM:
        return None
    y, _, dims = e.args[:3]
    if tuple(dims) == (0, 1, 3, 4) and tuple(y.shape) == (b, hk, s, d):
        return y, g
    if tuple(dims) != (0, 1, 2, 3, 4) or tuple(y.shape) != (b, hk, 1, s, d):
        return None
    u = producers.get(y, None)  # the unsqueeze: a broadcast or a reshape of k
    if u is None:
        return None
    k = u.args[0]
    if not isinstance(k, TensorProxy) or tuple(k.shape) != (b, hk, s, d):
        return None
    if u.sym.id == prims.PrimIDs.RESHAPE or (
            u.sym.id == prims.PrimIDs.BROADCAST_IN_DIM and tuple(u.args[2]) == (0, 1, 3, 4)):
        return k, g
    return None


def _group_sum(grad, g: int, consumers, returned):
    """The sum over each group of ``grad``: its reshape to ``[b, hk, g, s, d]``, then a sum
    over dim 2 (and over dims of extent one beside it: thunder's backward of a multi-query
    expansion sums over the one K head too, dropping it), each read by the next alone.
    (The two bound symbols, the sum's result), or None."""
    users = consumers.get(grad, [])
    if len(users) != 1 or grad.name in returned:
        return None
    (r,) = users
    b, h, s, d = grad.shape
    grouped = (b, h // g, g, s, d)
    if r.sym.id != prims.PrimIDs.RESHAPE or tuple(r.output.shape) != grouped:
        return None
    users = consumers.get(r.output, [])
    if len(users) != 1 or r.output.name in returned:
        return None
    (m,) = users
    if m.sym.name != "sum" or m.args[0].name != r.output.name or not isinstance(m.output, TensorProxy):
        return None
    dims = m.args[1] if len(m.args) > 1 else m.kwargs.get("dim", m.kwargs.get("dims"))
    dims = {dims % 5} if isinstance(dims, int) else {x % 5 for x in dims or ()}
    keepdim = m.args[2] if len(m.args) > 2 else m.kwargs.get("keepdim", False)
    if 2 not in dims or any(grouped[x] != 1 for x in dims - {2}) or keepdim or m.kwargs.get("dtype") is not None:
        return None
    kept = tuple(n for i, n in enumerate(grouped) if i not in dims)
    if m.output.dtype != grad.dtype or tuple(m.output.shape) != kept:
        return None
    return (r, m), m.output


_VIEWS = ("reshape", "view", "transpose", "permute", "slice_prim", "squeeze", "split", "chunk", "unbind")


def _view_of_more(x, producers) -> bool:
    """``x`` a view (reshapes, transposes, slices) of a tensor with more elements, which a
    saved ``x`` would hold to the backward whole: litgpt's V at its own heads is a slice of
    the fused q/k/v projection, ``(hq + 2 hk) / hk`` times its size (6 in Llama-3.2-1B)."""
    base, p = x, producers.get(x, None)
    while p is not None and p.sym.name in _VIEWS and isinstance(p.args[0], TensorProxy):
        base, p = p.args[0], producers.get(p.args[0], None)
    return p is not None and base.numel > x.numel


def grouped_kv_for_attention(trace: TraceCtx, cudnn_admits: Callable) -> TraceCtx:
    """``trace`` with each attention (and its backward) reading grouped-query K and V at
    their own heads; ``trace`` itself where none does. On CUDA only where asked for
    (``THUNDER_FUSER_GQA=1``: no GPU has yet checked cuDNN's grouped call against eager's
    here) and where ``cudnn_admits(q, k, v, bias, is_causal)`` (torch's own check, by the
    attention executor)."""
    from thunder_fuser import config

    bsyms = list(trace.bound_symbols)
    mode = config.choice("THUNDER_FUSER_GQA")
    if mode == "0" or not any(b.sym.name == FORWARD for b in bsyms):
        return trace
    producers, consumers = utils.producers_and_consumers(trace)
    returned = {p.name for b in bsyms if b.sym.id == prims.PrimIDs.RETURN for p in b.flat_proxy_args}
    out = from_trace(trace)
    replace: dict[int, list] = {}  # id of a bound symbol -> what stands in its place ([]: dropped)
    for f in bsyms:
        if f.sym.name != FORWARD:
            continue
        q, k, v, bias, is_causal = f.args[:5]
        sk, sv = _source_of_expansion(k, producers), _source_of_expansion(v, producers)
        if sk is None or sv is None or sk[1] != sv[1] or q.shape[1] != k.shape[1]:
            continue
        (k0, g), (v0, _) = sk, sv
        if q.device.type == "cuda" and (mode != "1" or not cudnn_admits(q, k0, v0, bias, is_causal)):
            continue
        compact = []  # K or V as a view of more: its own copy, so the projection is not held
        for i, x in enumerate((k0, v0)):
            if _view_of_more(x, producers):
                with tracectx(out):
                    c = TensorProxy(like=x)
                compact.append(prims.stride_order.bind(x, tuple(range(x.ndim - 1, -1, -1)), output=c))
                k0, v0 = (c, v0) if i == 0 else (k0, c)
        y = f.output[0]
        replace[id(f)] = [*compact, f.from_bsym(args=(q, k0, v0, *f.args[3:]))]
        for bw in consumers.get(y, []):
            if bw.sym.name != BACKWARD or [a.name for a in bw.args[1:5]] != [q.name, k.name, v.name, y.name]:
                continue
            dq, dk, dv = bw.output
            gk, gv = _group_sum(dk, g, consumers, returned), _group_sum(dv, g, consumers, returned)
            if gk is None or gv is None:
                continue
            grads, views = [], []
            for x, (_, summed) in ((k0, gk), (v0, gv)):
                if tuple(summed.shape) == tuple(x.shape):
                    grads.append(summed)
                    continue
                with tracectx(out):  # the sum dropped dims of one: the gradient at x's shape, then a view
                    grads.append(TensorProxy(like=x, dtype=summed.dtype))
                views.append(prims.reshape.bind(grads[-1], tuple(summed.shape), output=summed))
            replace[id(bw)] = [bw.from_bsym(args=(bw.args[0], q, k0, v0, *bw.args[4:]), output=(dq, *grads)), *views]
            for dropped in gk[0] + gv[0]:
                replace[id(dropped)] = []
    if not replace:
        return trace
    out.bound_symbols = [n for b in bsyms for n in replace.get(id(b), [b])]
    return dce(out)
