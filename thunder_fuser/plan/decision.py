"""A region's decision for one input specialization: layouts, segment kinds, launches, and
why; pure data, which ``explain`` reads and ``runtime/plan.py`` carries out.

thunder's prologue checks no strides, so one cached trace meets new layouts at run time.
The runner keys plans by the input strides (one tuple per tensor: no loops over
elements, no dlpack); a decision holds the layout the rule infers for that key, so a new
layout gets a new decision, never a wrong answer.

Most of a decision is made here, from the region, its segments and the call's strides. What
only a kernel prepared on the call's tensors can tell (a segment no kernel takes, notes on
how a kernel departs from its template, a shared launch refused) is decided at the plan's
first call and recorded here too, as data: ``fallbacks``, ``kernel_notes``, ``apart`` and
the ``kinds`` they change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from thunder_fuser.backends.cute.backend import kernel_mode
from thunder_fuser.functionalize import storage_roots
from thunder_fuser.inspect import debug
from thunder_fuser.ir.region import Region
from thunder_fuser.layout import dim_provenance, infer_allocation_orders, stride_order, strides_for_order
from thunder_fuser.layout.attention_operands import lay_out_for_attention
from thunder_fuser.layout.matmul_operands import lay_out_for_matmuls
from thunder_fuser.plan.stored_views import with_stored_views
from thunder_fuser.segment import Segment, schedule_segments
from thunder_fuser.segment.schedule import Schedule
from thunder_fuser.segment.transpose import transpose_segments
from thunder_fuser.segment.views import fresh_values

_OVERLAP_MSG = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory "
    "location. Please clone() the tensor before performing the operation."
)


def input_layout(region: Region, args) -> tuple[dict[str, tuple[int, ...]], dict[str, frozenset]]:
    orders, bcast = {}, {}
    for v, a in zip(region.inputs, args):
        if isinstance(a, torch.Tensor):
            st = a.stride()
            orders[v.name] = stride_order(a.shape, st)
            bcast[v.name] = frozenset(d for d in range(a.ndim) if st[d] == 0 and a.shape[d] != 1)
    return orders, bcast


@dataclass
class Decision:
    region: Region
    segments: list[Segment]
    orders: dict[int, tuple[int, ...]]
    kinds: dict[int, str]  # segment index -> what runs it (a fallback at the first call: "reference")
    schedule: Schedule  # computed once per plan, not per call
    error: str | None = None
    out_strides: list = field(default_factory=list)
    written_inputs: tuple[int, ...] = ()  # inputs written in place, directly or through views
    directly_written: tuple[int, ...] = ()  # those written as themselves
    layout_notes: list = field(default_factory=list)  # where readers after the region changed a layout
    # value id -> strides: fresh values a region output views (``viewed_roots``); where torch
    # computes one (a segment on the reference backend), it is copied into the plan's layout
    viewed: dict = field(default_factory=dict)
    # decided at the first call, when the kernels are prepared on its tensors:
    fallbacks: dict = field(default_factory=dict)  # segment index -> why no kernel runs it
    kernel_notes: dict = field(default_factory=dict)  # segment index -> how its kernel departs from the templates
    apart: dict = field(default_factory=dict)  # first segment index of a step -> why its segments launch apart


def decide(region: Region, segments: list[Segment], args) -> Decision:
    in_orders, in_bcast = input_layout(region, args)
    prov = dim_provenance(region, in_bcast)
    strides = {v.name: tuple(a.stride()) for v, a in zip(region.inputs, args) if isinstance(a, torch.Tensor)}
    orders = infer_allocation_orders(region, in_orders, in_bcast, prov, strides)
    fresh = fresh_values(region, segments)
    notes = lay_out_for_attention(region, orders, fresh) + lay_out_for_matmuls(region, orders, fresh)
    if kernel_mode({id(v): a for v, a in zip(region.inputs, args)}, region) is not None:
        segments, stored = with_stored_views(region, segments, args, orders)
        if stored:  # the stored views are allocated now too: lay them out for their matmul
            now = fresh_values(region, segments)
            notes += stored + lay_out_for_matmuls(region, orders, now - fresh)
            fresh = now
    kinds = {s.index: s.kind for s in segments}
    for i in transpose_segments(segments, region, orders, prov):
        kinds[i] = "transpose"
    error = None
    written = {id(n.written) for n in region.writes()}
    for v, a in zip(region.inputs, args):
        if id(v) in written and isinstance(a, torch.Tensor) and torch._debug_has_internal_overlap(a) == 1:
            error = f"{_OVERLAP_MSG} (in-place write into '{v.name}' in {region.name})"
    out_strides = [
        strides_for_order(o.shape, orders[id(o)]) if id(o) in fresh and o.is_tensor and id(o) in orders else None
        for o in region.outputs
    ]
    roots = storage_roots(region)
    viewed = viewed_roots(region, roots, fresh, orders)
    # an input written through a view of it is written too: torch refuses both for a leaf that
    # requires grad (the gradient would be lost)
    written_roots = {id(roots.get(id(n.written), n.written)) for n in region.writes()}
    written |= {id(roots.get(id(v), v)) for v in region.self_copies}
    written_inputs = tuple(i for i, v in enumerate(region.inputs) if id(v) in written or id(v) in written_roots)
    directly_written = tuple(i for i, v in enumerate(region.inputs) if id(v) in written)
    debug.dump("layout", lambda: _layout_text(region, in_orders, orders, kinds))
    return Decision(region, segments, orders, kinds, schedule_segments(region, segments), error, out_strides,
                    written_inputs, directly_written, notes, viewed)


def viewed_roots(region: Region, roots: dict, fresh: set, orders: dict) -> dict:
    """Value id -> strides of each fresh value a region output is a view of: its layout is
    the output's, so it must be the plan's whoever computes it. A kernel allocates it so; a
    segment torch runs (the reference backend) gets torch's layout for the ops it runs (a
    log_softmax over dim 0 of a permuted fp64 input came out permuted where eager's is
    contiguous), and is copied into the plan's."""
    viewed = {}
    for o in region.outputs:
        r = roots.get(id(o))
        if r is not None and r is not o and r.is_tensor and id(r) in fresh and id(r) in orders:
            viewed[id(r)] = strides_for_order(r.shape, orders[id(r)])
    return viewed


def _layout_text(region, in_orders, orders, kinds) -> str:
    lines = [f"{region.name}: inputs " + ", ".join(f"{n} order {o}" for n, o in in_orders.items())]
    for o in region.outputs:
        if id(o) in orders:
            why = f" (read by a {region.matmul_reads[o.name]} matmul)" if o.name in region.matmul_reads else ""
            why += " (read by attention)" if o.name in region.attention_reads else ""
            lines.append(f"  output {o.name} {tuple(o.shape)} allocation order {orders[id(o)]}{why}")
    lines.append("  segment kinds: " + ", ".join(f"{i}={k}" for i, k in kinds.items()))
    return "\n".join(lines)


