"""Run a lowered program with torch over the exact operand views a kernel would receive.

This is the CPU check of everything between a segment and a generated kernel: lowering
(views pushed to loads, pieces shifted) and geometry (strides, dim order, coalescing). A
test that compares it with the reference backend fails on the same mistakes a kernel would
make, on a machine with no GPU.
"""

from __future__ import annotations

import torch

from thunder_fuser.backends.cute.lower.expr import Load, Op, Program, Reduce, Select
from thunder_fuser.backends.cute.tiling.base_maps import mapped_layout, ref_first
from thunder_fuser.backends.cute.tiling.operands import Geometry
from thunder_fuser.backends.reference import _conform
from thunder_fuser.ir.torch_impls import REFERENCE_IMPLS


def run_program(prog: Program, geo: Geometry, views: list[torch.Tensor]) -> None:
    views = from_bases(geo, views)
    memo: dict[int, object] = {}
    ndim = len(geo.outer) + 1
    # a row kernel reduces the last dim; a column kernel, and a row kernel's sums per
    # column, every dim but the last
    reduced_dims = tuple(range(ndim - 1)) if geo.columns else (ndim - 1,)
    column_dims = tuple(range(ndim - 1))
    domain_shape = views[geo.store_slot[0]].shape

    def axis_of(dim: int) -> int:
        """The operand axis of a cat/pad along domain dim ``dim``: the outermost outer mode, or
        the vector dim."""
        return len(geo.outer) - 1 if dim == geo.outer_select_dim else ndim - 1

    def ev(e):
        if isinstance(e, (bool, int, float)):
            return e
        if id(e) in memo:
            return memo[id(e)]
        if isinstance(e, Load):
            r = views[geo.load_slot[id(e)]]
            if e.shifts:  # a cat/pad piece: placed at its start, zero elsewhere (as a kernel reads it)
                whole = torch.zeros(domain_shape, dtype=r.dtype, device=r.device)
                at = whole
                for dim, shift in e.shifts:
                    at = at.narrow(axis_of(dim), shift, r.shape[axis_of(dim)])
                at.copy_(r)
                r = whole
        elif isinstance(e, Op):
            r = REFERENCE_IMPLS[e.op](*[ev(a) for a in e.args], *((e.dtype,) if e.op == "convert_element_type" else ()))
            r = _conform(r, _Typed(e.dtype))
        elif isinstance(e, Reduce):
            x = torch.as_tensor(ev(e.arg)).expand(views[geo.store_slot[0]].shape)
            dims = column_dims if e.across else reduced_dims
            if e.op in ("var", "mean"):
                var, mean = torch.var_mean(x, dims, correction=e.correction, keepdim=True)
                r = var if e.op == "var" else mean
            else:
                r = REFERENCE_IMPLS[e.op](x, dims).reshape([1 if d in dims else s for d, s in enumerate(x.shape)])
            r = r.to(e.dtype)
        elif isinstance(e, Select):
            r = torch.full(domain_shape, e.fill, dtype=e.dtype, device=views[0].device)
            axis = axis_of(e.dim)
            for p, lo, hi in zip(e.pieces, e.bounds, e.bounds[1:]):
                piece = torch.as_tensor(ev(p), device=r.device).expand(domain_shape)
                r.narrow(axis, lo, hi - lo).copy_(piece.narrow(axis, lo, hi - lo))
        else:
            raise TypeError(e)
        memo[id(e)] = r
        return r

    try:
        # every store's value before any is written, as a kernel reads each element before it
        # writes there: a store written over a dead input (``runtime/donation.py``) must not
        # change what a later store reads of it (the sums of a normalization's backward)
        writes = []
        for st, slot in zip(prog.stores, geo.store_slot):
            v = views[slot]
            r = torch.as_tensor(ev(st.expr), device=v.device).expand(v.shape)
            if st.is_row or st.across:  # one number per row (column): the view repeats it along the reduced dims
                dims = column_dims if st.across else reduced_dims
                one = tuple(slice(0, 1) if d in dims else slice(None) for d in range(ndim))
                v, r = v[one], r[one]
            writes.append((v, r))
        places = {v.untyped_storage().data_ptr() for v, _ in writes}
        for v, r in writes:
            v.copy_(r.clone() if r.untyped_storage().data_ptr() in places and len(writes) > 1 else r)
    finally:
        # ``ev`` is recursive: its closure holds itself, a cycle that would keep the call's
        # tensors alive until the cyclic collector runs (so a dead input looked held)
        memo.clear()
        views.clear()


def from_bases(geo: Geometry, views) -> list[torch.Tensor]:
    """The operands a launch function builds from the base tensors it is passed
    (``Geometry.base_maps``; with an offset, as (base, element offset)), the map's
    reference operand first."""
    views = list(views)
    ref = geo.map_ref
    for i in ref_first(len(views), ref):
        m = geo.base_maps[i] if geo.base_maps else None
        if m:
            b, offset = views[i] if m.offset else (views[i], 0)
            shape, stride = mapped_layout(m, b.shape, b.stride(), None if i == ref else views[ref].shape)
            views[i] = b.as_strided(shape, stride, b.storage_offset() + offset)
    return views


class _Typed:
    def __init__(self, dtype):
        self.dtype = dtype
