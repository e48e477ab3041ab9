"""Each prim of the region IR as torch computes it: the table the reference backend runs
(``backends/reference.py``), the layout asks for the strides torch gives a view
(``layout/allocation_order.py``), and the CPU check of lowered kernels evaluates with.

Semantics follow thunder's prims (for example integer ``div`` truncates, ``sum`` over no
dims is the identity).
"""

from __future__ import annotations

import operator

import torch


def strides_for_order(shape, order) -> tuple[int, ...]:
    """The strides of a dense tensor of ``shape`` whose dims lie in ``order``, outermost first."""
    strides = [0] * len(shape)
    acc = 1
    for d in reversed(order):
        strides[d] = acc
        acc *= max(shape[d], 1)
    return tuple(strides)


def _div(a, b):
    def exact(x):
        return isinstance(x, (bool, int)) or (
            isinstance(x, torch.Tensor) and not x.dtype.is_floating_point and not x.dtype.is_complex
        )

    if exact(a) and exact(b):
        return torch.div(a, b, rounding_mode="trunc")
    return torch.true_divide(a, b)


def _as_tensor(x, like: torch.Tensor):
    return x if isinstance(x, torch.Tensor) else torch.tensor(x, device=like.device)


def _binary_torch(fn):
    """torch binary functions that need both operands as tensors."""

    def run(a, b):
        like = a if isinstance(a, torch.Tensor) else b
        return fn(_as_tensor(a, like), _as_tensor(b, like))

    return run


def _reduce(fn):
    def run(a, dims, *args, **kwargs):
        if len(dims) == 0:
            return a.clone()
        return fn(a, tuple(dims), *args, **kwargs)

    return run


def _broadcast_in_dim(a, shape, broadcast_dimensions):
    view_shape = [1] * len(shape)
    for src_dim, dst_dim in enumerate(broadcast_dimensions):
        view_shape[dst_dim] = a.shape[src_dim]
    return a.reshape(view_shape).expand(shape)


def _slice(a, start_indices, end_indices, strides=None):
    strides = strides or (1,) * a.ndim
    return a[tuple(slice(s, e, st) for s, e, st in zip(start_indices, end_indices, strides))]


def _pad(a, padding_value, padding_config):
    interior = any(d > 0 for _, _, d in padding_config)
    flat = [x for lo, hi, _ in reversed(padding_config) for x in (lo, hi)]
    if not interior:
        return torch.nn.functional.pad(a, flat, value=padding_value)
    shape = [n + max(0, n - 1) * d for n, (_, _, d) in zip(a.shape, padding_config)]
    dilated = torch.full(shape, padding_value, device=a.device, dtype=a.dtype)
    dilated[tuple(slice(None, None, d + 1) for _, _, d in padding_config)] = a
    return torch.nn.functional.pad(dilated, flat, value=padding_value)


def _convert_element_type(a, dtype):
    if isinstance(a, torch.Tensor):
        return a.to(dtype)
    return dtype(a)


def _full(shape, fill_value, *, device, dtype):
    return torch.full(shape, fill_value, device=device, dtype=dtype)


def _iota(length, *, start, step, device, dtype):
    return torch.arange(start, start + length * step, step, device=device, dtype=dtype)[:length]


def _copy_(src, dst, **_):
    if isinstance(src, torch.Tensor) and src.data_ptr() == dst.data_ptr() and src.stride() == dst.stride():
        return dst
    dst.copy_(src)
    return dst


def _copy_to_out_(computed, *, out):
    return _copy_(computed, out)


_ROW_MAJOR = [tuple(range(n - 1, -1, -1)) for n in range(64)]  # stride_order's order for x.contiguous()


def _stride_order(a: torch.Tensor, order) -> torch.Tensor:
    """thunder's stride_order: ``a`` itself where it is dense with its strides ordered like
    ``order`` (``order[d]``: the rank of dim d's stride, 0 the innermost), else a copy laid
    out so, as ``Tensor.contiguous`` does (which it is, for the row-major order: a call a
    decode step makes a dozen times, cheapest in C)."""
    if order == _ROW_MAJOR[a.ndim]:
        return a.contiguous()
    dims = sorted(range(a.ndim), key=lambda d: -order[d])  # outermost first
    want = strides_for_order(a.shape, dims)
    if all(n == 1 or s == w for n, s, w in zip(a.shape, a.stride(), want)):
        return a
    return torch.empty_strided(a.shape, want, dtype=a.dtype, device=a.device).copy_(a)


REFERENCE_IMPLS = {
    "abs": torch.abs, "neg": operator.neg, "exp": torch.exp, "exp2": torch.exp2,
    "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "log2": torch.log2,
    "log10": torch.log10, "tanh": torch.tanh, "erf": torch.erf, "erfc": torch.erfc,
    "rsqrt": torch.rsqrt, "sqrt": torch.sqrt, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "sinh": torch.sinh, "cosh": torch.cosh, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "reciprocal": torch.reciprocal, "sign": torch.sign,
    "signbit": torch.signbit, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "trunc": torch.trunc, "isfinite": torch.isfinite, "bitwise_not": torch.bitwise_not,
    "lgamma": torch.lgamma, "digamma": torch.digamma,
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": _div,
    "pow": operator.pow, "maximum": _binary_torch(torch.maximum),
    "minimum": _binary_torch(torch.minimum), "eq": operator.eq, "ne": operator.ne,
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
    "atan2": _binary_torch(torch.atan2), "fmod": _binary_torch(torch.fmod),
    "remainder": _binary_torch(torch.remainder), "bitwise_and": operator.and_,
    "bitwise_or": operator.or_, "bitwise_xor": operator.xor,
    "bitwise_left_shift": operator.lshift, "bitwise_right_shift": operator.rshift,
    "where": torch.where, "lerp": torch.lerp,
    "convert_element_type": _convert_element_type, "full": _full, "iota": _iota,
    "broadcast_in_dim": _broadcast_in_dim, "reshape": torch.reshape,
    "transpose": torch.permute, "squeeze": lambda a, dims: a.squeeze(tuple(dims)) if dims else a,
    "shallow_copy": lambda a: a,
    "stride_order": _stride_order,
    "slice_prim": _slice, "cat": lambda tensors, dim: torch.cat(list(tensors), dim), "pad": _pad,
    "sum": _reduce(torch.sum), "amax": _reduce(torch.amax), "amin": _reduce(torch.amin),
    "prod": _reduce(lambda a, dims: _prod(a, dims)),
    "var": lambda a, dims, *, correction: torch.var(a, tuple(dims), correction=correction),
    "var_mean": lambda a, dims, *, correction: torch.var_mean(a, tuple(dims), correction=correction),
    "copy_": _copy_, "copy_to_out_": _copy_to_out_,
    "update_aliases": lambda aliases: tuple(aliases),
}


def _prod(a, dims):
    for d in sorted(dims, reverse=True):
        a = torch.prod(a, d)
    return a
