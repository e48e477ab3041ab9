"""A bool tensor with a Python int promotes to int64, as in torch.

thunder 0.2.6's exact type lattice joins a bool tensor with a Python ``int`` into a weak
``int8``: ``(x > 0) * 200`` is traced as ``convert_element_type(t, int8)`` then a multiply,
where torch computes int64. thunder's torch executor hides it by calling ``torch.mul`` on
the real tensors; an executor that runs the traced prims (ours, nvFuser) returns int8 and
wraps 200 to -56, and ``((x > 0) * 200) * x`` then comes back in float with the wrapped
values: silently wrong. torch's rule: a Python number of a higher category than every
tensor gives that category's default dtype, int64 for an int. The four entries of the
table that join a bool tensor (strong, or weak where it has no dims) with an ``int`` are
set to int64 (weak where the tensor was), for every thunder function in the process."""

from __future__ import annotations


def promote_bool_with_int_to_int64() -> bool:
    """Mend thunder's exact promotion table; False where thunder is not as expected."""
    try:
        from thunder.core import dtypes, utils
    except ImportError:
        return False
    table, index = utils._elementwise_exact_promotion_table, utils._exact_dtype_to_number_map
    i = index[int]
    for bool_tensor, result in ((dtypes.bool8, dtypes.int64), (dtypes.bool8_, dtypes.int64_)):
        b = index[bool_tensor]
        if table[b][i] not in (dtypes.int8_, result) or table[i][b] not in (dtypes.int8_, result):
            return False  # a thunder whose table differs: leave it
        table[b][i] = table[i][b] = result
    return True
