"""Writes of numbers into one tensor, one after another at fixed places: one fill per number.

A program that builds a mask row by row writes a number into a slice of the same tensor
once per row, in a Python loop (litgpt's Gemma-2 sliding-window mask:
``mask[i, start:i + 1] = 0.0`` for each of ``T`` rows, in every sliding-window layer of every
step). Written in place (``writes_in_place.py``) each write is one small launch: ``T`` of
them a layer, host time that grows with the sequence, where torch.compile makes one kernel.

``merge_constant_writes`` turns such a chain (each ``fuser_setitem_`` writes into what the
previous one returned, nothing else reads between them, every index a constant of ints and
slices, every value a number, the tensor floating-point) into one ``fuser_fill_at_``: on its
first call it applies the same indexing, in the same order, to a tensor of write numbers on
the host, so a later write wins where writes overlap exactly as in the program, and keeps
per distinct number a mask of the places it ends up in; each call is then a
``masked_fill_`` per distinct number. A chain is merged where that is cheaper than its
launches: a fill moves about five bytes per element of the tensor, and a launch costs about
what moving a few MB does, so chains of ``L`` writes into tensors of at most ``L`` Mi
elements (and at most ``_MOST`` elements: the host tensor of write numbers).
"""

from __future__ import annotations

import math

import torch
from thunder.core import dtypes, prims
from thunder.core.prims import OpTags
from thunder.core.proxies import TensorProxy
from thunder.core.trace import TraceCtx, from_trace

from thunder_fuser.passes.writes_in_place import in_place_ex, reader_counts, written_meta

_MOST = 1 << 26  # elements of a merged tensor: the host's tensor of write numbers is int32
_PER_WRITE = 1 << 20  # elements of tensor per write merged, at most (the cost rule above)
_KEPT = 64  # masks kept per process; beyond, each call builds its own (never a freed mask in a graph)
_MASKS: dict[tuple, list] = {}


def _masks(shape, keys, values, device) -> list[tuple[object, torch.Tensor]]:
    """(number, where it ends up) per distinct number of ``values``, after the writes in order."""
    owner = torch.full(shape, -1, dtype=torch.int32)
    for j, key in enumerate(keys):
        owner[key] = j
    distinct: dict[str, int] = {}
    group = [distinct.setdefault(repr(v), len(distinct)) for v in values]
    written = owner >= 0
    by_group = torch.full(shape, -1, dtype=torch.int32)
    by_group[written] = torch.tensor(group, dtype=torch.int32)[owner[written].long()]
    first = {g: values[group.index(g)] for g in distinct.values()}
    return [(first[g], (by_group == g).to(device)) for g in range(len(distinct))]


def _fill_at_(a, keys, values):
    k = (tuple(a.shape), a.device, repr(keys), repr(values))
    masks = _MASKS.get(k)
    if masks is None:
        masks = _masks(tuple(a.shape), keys, values, a.device)
        if len(_MASKS) < _KEPT:
            _MASKS[k] = masks
    for value, mask in masks:
        a.masked_fill_(mask, value)
    return a


fill_at_ = in_place_ex.register_operator("fuser_fill_at_", meta=written_meta, fn=_fill_at_,
                                         tags=(OpTags.IN_PLACE, OpTags.DONT_DCE))


def _constant_key(key) -> bool:
    items = key if isinstance(key, tuple) else (key,)
    for x in items:
        if isinstance(x, slice):
            if not all(v is None or (type(v) is int) for v in (x.start, x.stop, x.step)):
                return False
        elif not (type(x) is int or x is None or x is Ellipsis):
            return False
    return True


def _constant_write(b) -> bool:
    if b.sym.name != "fuser_setitem_" or len(b.args) != 3:
        return False
    base, key, value = b.args
    return (isinstance(base, TensorProxy) and dtypes.is_float_dtype(base.dtype) and _constant_key(key)
            and type(value) in (int, float))


def _link(bsyms, j):
    """The chain link at ``j``: a constant write, the ``shallow_copy`` of its result, and
    thunder's ``update_aliases`` of that copy where one follows; with the name the next write
    must write into. None where no link starts at ``j``."""
    if not (j + 1 < len(bsyms) and _constant_write(bsyms[j]) and bsyms[j + 1].sym.id == prims.PrimIDs.SHALLOW_COPY
            and bsyms[j + 1].args[0].name == bsyms[j].output.name):
        return None
    link = [bsyms[j], bsyms[j + 1]]
    written = bsyms[j + 1].output.name
    u = bsyms[j + 2] if j + 2 < len(bsyms) else None
    if (u is not None and u.sym.id == prims.PrimIDs.UPDATE_ALIASES and len(u.args[0]) == 1
            and u.args[0][0].name == written and len(u.output) == 1):
        link.append(u)
        written = u.output[0].name
    return link, written


def merge_constant_writes(trace: TraceCtx) -> TraceCtx:
    """``trace`` with each chain of constant writes (module docstring) one ``fuser_fill_at_``;
    ``trace`` itself where there is none."""
    bsyms = list(trace.bound_symbols)
    readers = reader_counts(bsyms)
    out, i, changed = [], 0, False
    while i < len(bsyms):
        chain, j, into = [], i, None  # links, each writing into what the one before returned
        while (found := _link(bsyms, j)) is not None:
            link, written = found
            if chain and (link[0].args[0].name != into or readers.get(into) != 1):
                break
            chain.append(link)
            j, into = j + len(link), written
        numel = math.prod(chain[0][0].args[0].shape) if chain else 0
        if len(chain) >= 2 and numel <= min(_MOST, len(chain) * _PER_WRITE):
            keys = tuple(link[0].args[1] for link in chain)
            values = tuple(link[0].args[2] for link in chain)
            out.append(fill_at_.bind(chain[0][0].args[0], keys, values, output=chain[-1][0].output))
            out.extend(chain[-1][1:])
            i, changed = j, True
            continue
        out.append(bsyms[i])
        i += 1
    if not changed:
        return trace
    new = from_trace(trace)
    new.bound_symbols = out
    return new
