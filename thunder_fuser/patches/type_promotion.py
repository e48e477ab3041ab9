"""Type promotion as torch's, where thunder 0.2.6's differs.

thunder's torch executor hides each of these by calling torch on the real tensors, which
promotes by its own rules whatever the trace's metadata says; an executor that runs the
traced prims (ours, nvFuser) returns the traced dtype, and the values computed in it:

- a bool tensor with a Python ``int``: thunder's exact lattice joins them into a weak
  ``int8``. ``(x > 0) * 200`` came back -56, and a float op after it returned the wrapped
  values, silently. torch: a number of a higher category than every tensor gives that
  category's default dtype, int64 (weak where the tensor is a 0-d one).
- ``uint8`` with a 0-d signed integer tensor (a weak dtype), or a 0-d ``uint8`` with a
  signed one: thunder's table gives int16 for every such pair, as though both had dims.
  torch: a 0-d tensor of the same category as a tensor with dims does not promote it
  (``uint8 + int64 0-d`` is uint8, ``int8 + uint8 0-d`` is int8); two 0-d ones promote as
  ``torch.promote_types`` (``uint8 0-d + int32 0-d`` is int32, not int16).
- ``floor_divide`` of a bf16 or fp16 tensor (``x // 3``): thunder's float path ends in a
  ``copysign(0, ...)`` and a ``where`` that widen it to fp32. torch returns the operands'
  promoted dtype (computed in fp32, rounded once).

The table entries are mended for every thunder function in the process (ours or not);
``tests/test_type_promotion.py`` compares every pair of dtypes, with dims and without,
against eager.
"""

from __future__ import annotations

from thunder_fuser.patches.wrap import wrap_once


def promote_as_torch() -> bool:
    """Mend thunder's exact promotion table and floor division; False where thunder is not
    as expected (a table whose entries differ from 0.2.6's is left as it is)."""
    try:
        from thunder import clang
        from thunder.core import dtypes, utils
    except ImportError:
        return False
    table, index = utils._elementwise_exact_promotion_table, utils._exact_dtype_to_number_map
    i8_, i16_, i32_, i64_ = dtypes.int8_, dtypes.int16_, dtypes.int32_, dtypes.int64_
    i8, u8, u8_ = dtypes.int8, dtypes.uint8, dtypes.uint8_
    mends = {  # (a, b): (thunder's, torch's), entered both ways
        (dtypes.bool8, int): (i8_, dtypes.int64), (dtypes.bool8_, int): (i8_, i64_),
        (u8, i8_): (dtypes.int16, u8), (u8, i16_): (dtypes.int16, u8), (u8, i32_): (dtypes.int16, u8),
        (u8, i64_): (dtypes.int16, u8), (u8_, i8): (dtypes.int16, i8), (u8_, i8_): (dtypes.int16, i16_),
        (u8_, i16_): (dtypes.int16, i16_), (u8_, i32_): (dtypes.int16, i32_), (u8_, i64_): (dtypes.int16, i64_),
    }
    cells = [(index[a], index[b], was, now) for (a, b), (was, now) in mends.items()]
    cells += [(j, i, was, now) for i, j, was, now in cells]
    if any(table[i][j] not in (was, now) for i, j, was, now in cells):
        return False  # a thunder whose table differs: leave it
    for i, j, _, now in cells:
        table[i][j] = now
    return _floor_divide_in_the_promoted_dtype(clang, utils)


def _floor_divide_in_the_promoted_dtype(clang, utils) -> bool:
    def wrap(float_path):
        def _floor_divide_float(a, b):
            out = float_path(a, b)
            _, result = utils.elementwise_type_promotion(
                a, b, type_promotion_kind=utils.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
            return clang.maybe_convert_to_dtype(out, result)

        return _floor_divide_float

    return wrap_once(clang, "_floor_divide_float", wrap)
