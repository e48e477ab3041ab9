"""A lowered program and its geometry -> the CuTe DSL launch function of its kernel family.

The families, one module each: ``pointwise.py`` (and ``staged.py``, its operands read
through shared-memory tiles), ``rows.py`` (in registers or looped), ``columns.py`` and
``split_rows.py`` (two launches, ``partials.py``). Their layout math is computed without
the DSL, in ``geometry.py`` and the family's ``*_geometry.py``; the DSL helpers they share
are ``cute_values.py``, ``cute_memory.py`` and ``cute_reduce.py``.
"""

from __future__ import annotations

from thunder_fuser.backends.cute.families.columns import build_columns
from thunder_fuser.backends.cute.families.pointwise import build_pointwise
from thunder_fuser.backends.cute.families.rows import build_rows
from thunder_fuser.backends.cute.families.split_rows import build_split_rows
from thunder_fuser.backends.cute.families.staged import build_pointwise_staged
from thunder_fuser.backends.cute.lower.expr import Program
from thunder_fuser.backends.cute.tiling.geometry import Geometry


def build_launch(prog: Program, geo: Geometry):
    if geo.columns:
        return build_columns(prog, geo)
    if geo.split_rows:
        return build_split_rows(prog, geo)
    if prog.family == "rows":
        return build_rows(prog, geo)
    return build_pointwise_staged(prog, geo) if geo.stage else build_pointwise(prog, geo)
