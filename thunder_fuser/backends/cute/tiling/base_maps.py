"""How a kernel's launch function builds an operand from its base tensor (``BaseMap``), so
that a call passes the base as it is rather than an ``as_strided`` of it (3-4 us each on
the H100 host: RoPE's call made 8), and what a call passes and checks per operand.

A mode is a base dim, a ``Run`` of base dims whose strides nest (a merge; its outermost
dim may be sliced), a broadcast or extent 1. An offset (a slice's start) is passed beside
the base as a number, not compiled in, so a window at another start shares the kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from thunder_fuser.backends.cute.tiling.operands import Geometry, Operand


def aligned(checks, tensors) -> bool:
    """Per call: do the base pointers still allow the vector width the kernel assumes?
    ``checks``: (base index, byte offset, alignment) triples, from ``Geometry.align_checks``."""
    for source, byte_offset, align in checks:
        if (tensors[source].data_ptr() + byte_offset) % align:
            return False
    return True


def static_modes(geo: Geometry, o: Operand) -> set[int]:
    """The modes of ``o`` whose extents the kernel knows statically, as the signature holds
    them (a piece's N, the pieces of a select along the outermost mode:
    ``cute_memory.fake_operands``): a base map builds them as those numbers."""
    static = set()
    if o.shape[-1] != geo.n:
        static.add(len(o.shape) - 1)
    if geo.outer_select and geo.outer:
        static.add(len(geo.outer) - 1)
    return static


def choose_map_ref(geo: Geometry) -> int:
    """The operand whose extents a broadcast mode of a base map takes: a store that
    broadcasts along no mode, else a load of the stores' extents that does not (a column
    reduction's input: its one store repeats along the reduced rows)."""
    ops = geo.operands
    first = ops[geo.store_slot[0]]
    stores = [i for i in geo.store_slot if 0 not in ops[i].stride]
    loads = [i for i, o in enumerate(ops) if not o.is_store and o.iota is None and 0 not in o.stride and o.shape == first.shape]
    return next(iter(stores + loads), geo.store_slot[0])


# modes of a base map that are no base dim: a broadcast (stride 0, the reference operand's
# extent), or extent 1 with stride 1 (ONE) or 0 (ONE_BROADCAST), as the operand's own mode
# is: the kernel reads a mode whose stride was 1 as contiguous (a vector access), so a
# stride-0 rebuild of it would break its vector view (an all-extent-1 input, x + x)
BROADCAST, ONE, ONE_BROADCAST = -1, -2, -3


PRODUCT = 0  # a Run's extent: the product of its dims' extents


class Run(NamedTuple):
    """A mode made of a run of base dims, outermost first, stepping as one (their strides
    nest: a merge, as ``view`` makes), with the innermost dim's stride. Its extent: PRODUCT
    (the dims' own), None (the reference operand's extent of the mode: a run that spans the
    domain, where the outermost dim may be sliced), or a number (a piece's static extent)."""

    dims: tuple
    extent: int | None = PRODUCT


class BaseMap(NamedTuple):
    """How the launch function builds an operand from its base tensor (``mode_map``): per
    operand mode a base dim (int >= 0), a Run, BROADCAST, ONE or ONE_BROADCAST; and whether
    its first element lies an offset into the base (a slice's start, a selected index). The
    offset is passed beside the base per call, a number the plan holds, not compiled in: a
    slice at another start (a cache written at each position) takes the same kernel."""

    modes: tuple
    offset: bool = False


def mode_map(o: Operand, base: torch.Tensor, ref: Operand | None, static: set = frozenset()) -> BaseMap | None:
    """Operand ``o`` as a BaseMap of its base tensor, so that a call passes the base as it
    is rather than an ``as_strided`` of it (3-4 us each on the H100 host): each mode a base
    dim, a run of them merged (its outermost dim perhaps sliced), a broadcast or extent 1.
    None where the view is not that (dims that do not nest, a slice of an inner dim).

    Each mode's innermost base dim is the one with its stride, and the run grows outward
    while the next dim's stride is the run's size times its own; extent-1 dims that nest so
    join it even past its extent, which keeps the map, and so the kernel, the same for a
    batch of 1 as for a batch of 16. A run in one of the ``static`` modes takes its extent
    as a number, as the kernel knows it. The map is checked by rebuilding the view's layout
    from the base's: a plan's calls share its base strides (its key) and extents (thunder's
    trace), so the layout rebuilt per call is the view's."""
    if base.ndim == 0:
        return None
    bshape, bstride = tuple(base.shape), base.stride()
    ones_first = sorted(range(base.ndim), key=lambda e: bshape[e] != 1)
    used, modes = set(), []
    for j, (ext, st) in enumerate(zip(o.shape, o.stride)):
        if ext == 1:
            modes.append(ONE if st else ONE_BROADCAST)
            continue
        if st == 0:
            if ref is None or ref.shape[j] != ext:
                return None
            modes.append(BROADCAST)
            continue
        free = [d for d in range(base.ndim) if d not in used and bshape[d] > 1]
        d = next((d for d in free if bstride[d] == st), None)
        if d is None:
            return None
        dims, size = [d], bshape[d]
        while True:  # extent-1 dims that nest join too, so that a batch of 1 maps as a batch of 16 does
            outer = next((e for e in ones_first if e not in used and e not in dims and bstride[e] == size * st
                          and (size < ext or bshape[e] == 1)), None)
            if outer is None:
                break
            dims.insert(0, outer)
            size *= bshape[outer]
        if size < ext or ext % (size // bshape[next(e for e in dims if bshape[e] > 1)]):
            return None  # the dims do not reach the extent, or a slice cuts an inner dim
        used.update(dims)
        if len(dims) == 1 and size == ext:
            modes.append(d)
        elif j in static:
            modes.append(Run(tuple(dims), ext))
        elif ref is not None and ref.shape[j] == ext and ref.stride[j] != 0:
            modes.append(Run(tuple(dims), None))
        else:
            modes.append(Run(tuple(dims), PRODUCT if size == ext else ext))
    m = BaseMap(tuple(modes), o.offset != 0)
    if mapped_layout(m, bshape, bstride, None if ref is None else ref.shape) != (o.shape, o.stride):
        return None
    return m


def mapped_layout(m: BaseMap, shape, stride, ref_shape) -> tuple[tuple, tuple]:
    """(shape, stride) of the operand built from a base of ``shape``/``stride`` by map ``m``
    (``Geometry.base_maps``); plain indexing and products, so the launch function (CuTe
    values) and ``torch_eval`` (ints) share it. ``ref_shape``: the reference operand's
    extents (None for the reference itself, whose map takes none)."""
    extents, strides = [], []
    for j, e in enumerate(m.modes):
        if isinstance(e, Run):
            if e.extent == PRODUCT:
                size = shape[e.dims[0]]
                for d in e.dims[1:]:
                    size = size * shape[d]
            else:
                size = ref_shape[j] if e.extent is None else e.extent
            extents.append(size)
            strides.append(stride[e.dims[-1]])
        else:
            extents.append(shape[e] if e >= 0 else (ref_shape[j] if e == BROADCAST else 1))
            strides.append(stride[e] if e >= 0 else (1 if e == ONE else 0))
    return tuple(extents), tuple(strides)


def ref_first(n: int, ref: int) -> list[int]:
    """Operand indices with the map's reference first: its extents must exist before a
    broadcast mode takes them."""
    return [ref] + [i for i in range(n) if i != ref]


def views_for_call(geo: Geometry, bases) -> tuple:
    """Each operand as the launch takes it: its base tensor itself where that is the
    operand's view or the launch function builds the view from it (``Geometry.base_maps``),
    with the element offset of its first element beside it where it has one, else one
    ``as_strided`` (per call: 1-4 us each)."""
    return tuple([
        bases[i] if v is None else (bases[i], v) if isinstance(v, int) else
        bases[i].as_strided(v[0], v[1], bases[i].storage_offset() + v[2])
        for i, v in geo.call_views
    ])
