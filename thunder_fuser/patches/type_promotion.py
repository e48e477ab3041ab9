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
- ``copysign(a, b)`` returned ``a``'s dtype (``copysign(bf16, fp32)`` in bf16, and an
  integer ``a`` with a bf16 ``b`` in fp32). torch: the operands' promoted dtype, integers
  made float.
- ``pow`` of a bool tensor by a Python bool: thunder's int64 (``BOOL_TO_LONG``); torch
  keeps bool. A bool tensor by a bool tensor, which torch does not implement, is an error
  here too, not an int64 result.
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
    kind = utils.ELEMENTWISE_TYPE_PROMOTION_KIND
    return (_in_the_promoted_dtype(clang, utils, "_floor_divide_float", kind.DEFAULT)
            and _in_the_promoted_dtype(clang, utils, "copysign", kind.INT_TO_FLOAT)
            and wrap_once(clang, "pow", lambda op: _bool_pow(clang, dtypes, utils, op)))


def _bool_pow(clang, dtypes, utils, op):
    """``clang.pow`` as torch's for bools. thunder promotes a bool base to int64 for every
    exponent; torch keeps bool for a Python bool exponent (``x ** True`` is ``x``,
    ``x ** False`` all true), and implements no pow of a bool tensor by a bool tensor."""
    def is_bool_tensor(t) -> bool:
        return getattr(t, "dtype", None) in (dtypes.bool8, dtypes.bool8_) and hasattr(t, "shape")

    def pow(a, b):
        if is_bool_tensor(b) and (is_bool_tensor(a) or isinstance(a, bool)):
            utils.check(False, lambda: "pow: a bool base with a bool tensor exponent: torch implements no "
                        "\"pow\" for Bool", exception_type=NotImplementedError)
        if is_bool_tensor(a) and isinstance(b, bool):
            return clang.maybe_convert_to_dtype(op(a, b), dtypes.bool8)
        return op(a, b)

    pow.__name__ = pow.__qualname__ = op.__name__
    return clang.clangop(method_name="pow")(pow)


def _in_the_promoted_dtype(clang, utils, name: str, kind) -> bool:
    """``clang.<name>(a, b)`` converted to the dtype torch promotes ``a`` and ``b`` to.

    Made a clang op as thunder's own decorator makes one (``clang.clangop``): thunder's jit
    runs a function of its clang set as it is and interprets any other, and interpreted, the
    promotion's type check met the interpreter's wrapped proxy, not a TensorProxy (thunder's
    opinfo for copysign jits ``clang.copysign`` itself)."""
    def wrap(op):
        def in_the_promoted_dtype(a, b):
            _, result = utils.elementwise_type_promotion(a, b, type_promotion_kind=kind)
            return clang.maybe_convert_to_dtype(op(a, b), result)

        in_the_promoted_dtype.__name__ = in_the_promoted_dtype.__qualname__ = op.__name__
        return clang.clangop()(in_the_promoted_dtype)

    return wrap_once(clang, name, wrap)
