"""What a kernel is compiled for: its operands' views over the domain and its tiling.

``geometry.build_geometry`` fills a ``Geometry`` from a program and the first call's
tensors; the families' ``*_geometry.py`` modules add their tiling to it; its
``signature()`` is the compile key (with the program's text), and ``Operand`` views tell
each call what to pass. A module of its own, so that every geometry module can name these
types without importing another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Operand:
    source: int  # index into Geometry.bases
    shape: tuple[int, ...]  # the view passed to the kernel: outer dims innermost-first, then N
    stride: tuple[int, ...]
    offset: int  # elements from the base tensor's own storage offset
    is_store: bool
    dtype: torch.dtype
    # an integer iota the kernel computes rather than loads: (start, step, offset); the
    # value at an element is start + step * (offset + its index in the view)
    iota: tuple[int, int, int] | None = None

    @property
    def inner_mode(self) -> str:
        s = self.stride[-1]
        return "vec" if s == 1 else ("bcast" if s == 0 or self.shape[-1] == 1 else "gather")

    def back_to_back(self, rows: int, n: int) -> bool:
        """Rows of ``n`` elements one after another, ``rows`` of them (one outer mode of
        stride ``n``): a flat run of elements (``flat_rows``)."""
        return self.inner_mode == "vec" and self.iota is None and self.stride == (n, 1) and self.shape == (rows, n)

    @property
    def same_every_row(self) -> bool:
        """Every row reads the same elements (a norm's weight): no outer stride but 0."""
        return not any(self.stride[:-1])


@dataclass
class Geometry:
    operands: list[Operand]
    load_slot: dict[int, int]  # id(Load) -> operand index
    store_slot: list[int]  # per program store -> operand index
    outer: tuple[int, ...]  # coalesced outer extents, outermost first
    n: int  # coalesced innermost extent (the vector dim, or the row)
    vector: int
    tail: bool  # N % vector != 0 (only without outer dims): the last vector is predicated
    row_threads: int = 0
    row_vectors: int = 0  # 0 with row_threads set: the row is too long for registers (looped passes)
    last_use: bool = False  # looped rows: the last pass marks its loads the row's last use (LOOP_LAST_USE_BYTES)
    flat: bool = False  # a row or pointwise kernel taking vectors of its rows back to back (``flat_rows``)
    columns: bool = False  # a column reduction: the reduced dims are the outer ones
    across: bool = False  # a row kernel that also sums per column (``across_splits``)
    split_rows: bool = False  # a row reduction whose rows are split across blocks (``row_splits``)
    splits: tuple = ()  # columns, split rows and sums per column: (splits, rows, vectors or row blocks
    #                     per split), for the launches' workspace of partials (``column_splits``,
    #                     ``row_splits``, ``across_splits``); not compiled in
    col_vectors: int = 0  # column vectors per block (columns only)
    outer_select_dim: int | None = None  # the domain dim of a cat/pad along the outermost outer
    #                                      mode (pieces picked per row); a select along any other
    #                                      dim is along the vector dim
    reuse: tuple = ()  # pointwise: (outer mode, rows) a thread walks along one mode where some operand
    #                    is broadcast, loading that operand once for all its rows
    stage: tuple = ()  # pointwise: (outer mode, operand slots) read through shared-memory tiles, the
    #                    operands contiguous along that mode and strided along N (``transpose_stage``)
    # the tensors the operands view: the first call's while the geometry is built, then
    # meta stand-ins of the same shape, strides and dtype (``drop_call_tensors``)
    bases: list = field(default_factory=list)
    call_views: tuple = ()  # per operand: (base index, None where the base is passed as it is, an int
    #                        where it is passed beside that element offset, else (shape, stride,
    #                        element offset) of its ``as_strided``)
    align_checks: tuple = ()  # per vector operand: (base, byte offset, alignment) checked per call
    # per operand: None, or the BaseMap by which the kernel's launch function builds it from its
    # base tensor (passed as it is, no ``as_strided`` per call; broadcast modes take the extent
    # of operand ``map_ref``'s mode)
    base_maps: tuple = ()
    map_ref: int = 0
    index64: bool = False  # extents and thread indices in 64 bits (``geometry.needs_64bit_indices``)

    def drop_call_tensors(self) -> None:
        """Keep only what the compile and the signature read of the bases (their metadata):
        a geometry lives as long as its kernel, and holding the first call's tensors kept a
        whole training step's activations alive between steps (9 GiB held in one model)."""
        self.bases = [
            torch.empty(0, dtype=b.dtype, device="meta").as_strided(b.shape, b.stride(), b.storage_offset())
            for b in self.bases
        ]

    @property
    def outer_select(self) -> bool:
        return self.outer_select_dim is not None

    @property
    def looped(self) -> bool:
        """A row kernel whose rows are too long for registers: each pass re-reads the row."""
        return bool(self.row_threads) and not self.row_vectors and not self.split_rows

    def signature(self) -> tuple:
        ops = tuple(
            (str(o.dtype), o.is_store, o.inner_mode, tuple(s == 0 for s in o.stride[:-1]), o.shape[-1] if o.shape[-1] != self.n else -1,
             o.iota)
            for o in self.operands
        )
        return (
            len(self.outer), ops, self.vector, self.tail, self.row_threads, self.row_vectors, self.col_vectors, self.split_rows,
            self.outer_select and tuple(o.shape[len(self.outer) - 1] for o in self.operands), self.reuse, self.stage,
            self.across, self.last_use, self.flat,
            tuple(m and (m, self.bases[o.source].ndim) for m, o in zip(self.base_maps, self.operands)), self.map_ref,
            self.index64,
        )
