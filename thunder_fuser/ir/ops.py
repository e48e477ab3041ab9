"""The op catalogue: every prim a region may hold, and the family it belongs to.

The family decides how the segmenter treats a node: ``pointwise`` nodes share one
iteration space with their output; ``view`` nodes move no data (broadcast, reshape,
permute, squeeze); ``resize`` nodes change extents (slice, cat, pad); ``reduction`` nodes
collapse dims; ``write`` nodes store into an existing tensor; ``alias`` nodes only order
memory accesses. The executor claims exactly the prims listed here.
"""

from __future__ import annotations

UNARY = (
    "abs", "neg", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "erf", "erfc",
    "rsqrt", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "asin", "acos", "atan", "asinh",
    "acosh", "atanh", "reciprocal", "sign", "signbit", "floor", "ceil", "round", "trunc",
    "isfinite", "bitwise_not", "lgamma", "digamma",
)
BINARY = (
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
    "atan2", "fmod", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_left_shift", "bitwise_right_shift",
)
TERNARY = ("where", "lerp")
CAST = ("convert_element_type",)
CREATION = ("full", "iota")
# stride_order (``x.contiguous()``): the same values; a view where its operand is already
# dense in the order, else a copy laid out so (torch's rule). Inside a kernel it reads as its
# operand; only a tensor the region hands out keeps the layout (``layout/allocation_order``)
VIEW = ("broadcast_in_dim", "reshape", "transpose", "squeeze", "shallow_copy", "stride_order")
RESIZE = ("slice_prim", "cat", "pad")
# ops that only re-describe their operand's memory: torch may return a view of it
METADATA = VIEW + ("slice_prim",)
REDUCTION = ("sum", "amax", "amin", "prod", "var", "var_mean")
WRITE = ("copy_", "copy_to_out_")
ALIAS = ("update_aliases",)

POINTWISE = UNARY + BINARY + TERNARY + CAST + CREATION

KIND: dict[str, str] = {}
for _ops, _kind in (
    (POINTWISE, "pointwise"),
    (VIEW, "view"),
    (RESIZE, "resize"),
    (REDUCTION, "reduction"),
    (WRITE, "write"),
    (ALIAS, "alias"),
):
    for _op in _ops:
        KIND[_op] = _kind

SUPPORTED = frozenset(KIND)


def kind_of(op: str) -> str:
    return KIND[op]


def reduction_dims(node) -> tuple[int, ...]:
    """The reduced dims of a reduction node (its second positional argument)."""
    return tuple(sorted(node.args[1]))
