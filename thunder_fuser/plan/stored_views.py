"""View outputs a plan has its kernel store instead of leaving torch to make them.

A segment output that is a view (the GPT block's v as a ``[b, h, s, e]`` view of the
QKV projection) is normally made by torch after the kernels: free, and aliasing its
source as in eager. But where a matmul reads it in a layout the matmul cannot take
(``layout/matmul_operands.py``), torch copies it first, element by element, once per
matmul: the block's v and the attention output's gradient, three copies a step. The
kernel stores such a view instead, in the matmul's layout, at the cost of one vectorized
write (the read is shared with the kernel's other work, or a pointwise kernel of its own
for a view segment).

That needs the region's permission (``Region.copyable_outputs``): a stored copy no longer
aliases its source, which only the trace's in-place writes or its caller could observe,
so the executor grants it only for traces without in-place writes and for tensors the
trace does not return. Whether the matmul would copy is decided per plan, from the
strides the views get on the meta device from the call's input strides. A view torch
itself must copy to make (a reshape of dims that do not merge) is left to torch: the
kernel's operands could not view it either. A segment whose kernel could not store the
view keeps it as a view (no fallback, no warning).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from thunder_fuser.backends import reference
from thunder_fuser.backends.cute.backend import KERNEL_KINDS
from thunder_fuser.backends.cute.lower.expr import lower_segment
from thunder_fuser.backends.cute.unsupported import Unsupported
from thunder_fuser.ir.region import Region
from thunder_fuser.layout.allocation_order import strides_for_order
from thunder_fuser.layout.matmul_operands import matmul_copies
from thunder_fuser.segment import Segment
from thunder_fuser.segment.views import alias_views


def with_stored_views(region: Region, segments: list[Segment], args, orders: dict) -> tuple[list[Segment], list[str]]:
    """``segments``, each that should store some of its view outputs replaced by a copy
    that does (``Segment.stored_views``; a view segment becomes a pointwise one), and a
    line per stored view saying why (for ``explain``)."""
    metas = _Metas(region, args, orders)
    out, notes = [], []
    for seg in segments:
        stored = _views_to_store(region, seg, metas)
        if stored:
            kind = "pointwise" if seg.kind == "view" else seg.kind
            new = replace(seg, kind=kind, stored_views=frozenset(id(o) for o in seg.outputs if o.name in stored))
            try:
                lower_segment(new)
            except Unsupported:
                new = seg
            else:
                notes += [f"segment {seg.index} stores view output {name}: {why}" for name, why in stored.items()]
            seg = new
        out.append(seg)
    return out, notes


class _Metas:
    """Meta tensors standing for the region's values: inputs with the call's strides,
    computed values with the plan's layout (``orders``)."""

    def __init__(self, region: Region, args, orders: dict):
        self.orders = orders
        self.env: dict[int, object] = {}
        for v, a in zip(region.inputs, args):
            self.env[id(v)] = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a

    def get(self, v):
        if id(v) not in self.env:
            if not v.is_tensor or not isinstance(v.dtype, torch.dtype):
                raise KeyError(v.name)
            order = self.orders.get(id(v)) or tuple(range(v.ndim))
            self.env[id(v)] = torch.empty_strided(v.shape, strides_for_order(v.shape, order), dtype=v.dtype, device="meta")
        return self.env[id(v)]


def _views_to_store(region: Region, seg: Segment, metas: _Metas) -> dict[str, str]:
    """Output name -> why the segment should store it rather than make it as a view."""
    if seg.kind == "view":
        nodes = list(seg.nodes)
    elif seg.kind in KERNEL_KINDS:
        nodes = alias_views(seg)
    else:
        return {}
    if not nodes:
        return {}
    made = {id(o) for n in nodes for o in n.outputs}
    env: dict[int, object] = {}
    try:
        roots = {}
        for n in nodes:
            for v in n.inputs():
                if id(v) not in made and id(v) not in env:
                    env[id(v)] = metas.get(v)
                    if isinstance(env[id(v)], torch.Tensor):
                        roots[id(env[id(v)])] = env[id(v)]
        reference.run_nodes(nodes, env)
    except Exception:  # noqa: BLE001 - a view the meta device cannot make stays as it is
        return {}
    stored = {}
    for o in seg.outputs:
        t = env.get(id(o))
        if id(o) not in made or not isinstance(t, torch.Tensor):
            continue
        if id(t) not in roots and (t._base is None or id(t._base) not in roots):
            continue  # torch copies to make it: the kernel's operands could not view it either
        how = region.matmul_reads.get(o.name)
        if how is not None and o.name in region.copyable_outputs and matmul_copies(t.shape, t.stride(), how):
            stored[o.name] = f"a {how} matmul reads it, and would copy it first"
    return stored
