"""Ops thunder 0.2.6 registers automatically, defined here as thunder's own.

thunder has no symbol of its own for many torch ops: it registers them automatically (tag
``AUTO_REGISTERED``), as an opaque call to torch that no fusion executor can join, whose
backward (``<op>_vjp``) runs ``torch.autograd.functional.vjp``: the forward computed again
under torch's autograd and differentiated there. Every call pays the forward twice, torch's
kernels outside any region, and the host time of building and walking an autograd graph.
``tests/test_auto_registered_ops.py`` walks every zoo model's traces for such an op.

- ``torch.addmm``, ``addmv`` and ``addbmm`` (and ``baddbmm``, thunder's own, whose
  ``beta=0`` let a NaN in the input through): transformers' GPT-2 (its ``Conv1D`` is an
  ``addmm``) ran four a layer; at 12 layers on the H200 that was 1.1 ms of matmul, 1.3 ms of
  torch's sums and copies, and a step twice as long as torch.compile's on the host. Defined
  as thunder defines ``baddbmm``, their batched sibling: ``alpha`` times the product plus
  ``beta`` times the input, a factor of 1 left out. thunder's autodiff then differentiates
  the matmul (gradients in the operands' own layouts) and the bias's gradient is a column
  sum our reductions take beside their neighbours. As torch documents, ``beta=0`` ignores
  the input (a NaN in it does not reach the result), and ``alpha=0`` the product.
- ``Tensor.bool``, ``byte``, ``char``, ``short``, ``int``, ``half``, ``bfloat16``, ``double``:
  a dtype conversion (a sliding-window mask's ``.bool()`` in litgpt's Mistral, Phi-3 and
  Gemma-2) as thunder defines ``Tensor.long``, a ``to`` our kernels fuse.
"""

from __future__ import annotations

import torch

from thunder_fuser.patches.wrap import traced_as

CONVERSIONS = {"bool": torch.bool, "byte": torch.uint8, "char": torch.int8, "short": torch.int16, "int": torch.int32,
               "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}


def define_auto_registered_ops() -> bool:
    for name, (dims, summed, alpha_ignores) in MATMUL_ADDS.items():
        _define(f"thunder_fuser.{name}", name, (getattr(torch, name), getattr(torch.Tensor, name)),
                _scaled_sum(name, dims, summed, alpha_ignores))
    for name, dtype in CONVERSIONS.items():
        _define(f"thunder_fuser.Tensor.{name}", name, (getattr(torch.Tensor, name),), _conversion(name, dtype))
    return True


def _define(id: str, method_name: str, torchfns: tuple, fn) -> None:
    """``fn`` as thunder's symbol ``id`` for ``torchfns`` (and the method ``method_name``),
    traced wherever they are called; once (a second import finds it defined)."""
    import thunder.torch as ltorch

    if getattr(ltorch._torch_to_thunder_function_map.get(torchfns[0]), "id", None) == id:
        return
    sym = ltorch.torchsymbol(*torchfns, method_name=method_name, id=id)(fn)
    for torchfn in torchfns:
        traced_as(torchfn, sym)


def _conversion(name: str, dtype):
    def fn(a, /, memory_format=torch.preserve_format):
        import thunder.torch as ltorch

        out = ltorch.to(a, dtype=dtype)  # thunder's to drops memory_format when it converts
        return out if memory_format is torch.preserve_format else ltorch.contiguous(out, memory_format=memory_format)

    fn.__name__ = fn.__qualname__ = f"to_{name}"
    return fn


# name: (the operands' dims, whether the batch of products is summed, whether alpha=0
# ignores the product as torch's BLAS calls do: torch's own baddbmm multiplies it by 0, an
# inf there giving NaN). ``baddbmm`` is thunder's own, but it adds ``0 * input`` for
# ``beta=0`` (a NaN there reaches the result: transformers' older attention passes
# ``torch.empty`` as that input)
MATMUL_ADDS = {"addmm": ((2, 2), False, True), "addmv": ((2, 1), False, True), "addbmm": ((3, 3), True, True),
               "baddbmm": ((3, 3), False, False)}


def _scaled_sum(name: str, dims: tuple[int, int], summed: bool, alpha_ignores: bool):
    """torch's ``beta * input + alpha * (a @ b)``. As torch (and BLAS) do, ``beta=0``
    ignores the input, NaN or inf in it included, and so does ``alpha=0`` the product where
    ``alpha_ignores``; an ignored term's gradient is zeros, not None (an optimizer steps a
    parameter whose gradient is zeros)."""
    def fn(input, a, b, *, beta=1, alpha=1, out=None):
        import thunder.torch as ltorch
        from thunder.core import utils

        utils.check(out is None, lambda: f"torch.{name}: out= is not supported", NotImplementedError)
        utils.check((a.ndim, b.ndim) == dims, lambda: f"torch.{name}: its operands must be {dims[0]}-D and "
                    f"{dims[1]}-D, got {a.ndim}-D and {b.ndim}-D")
        utils.check(input.dtype == a.dtype == b.dtype, lambda: f"torch.{name}: the input and both operands must "
                    f"have one dtype, got {input.dtype}, {a.dtype} and {b.dtype}")
        prod = ltorch.matmul(a, b)
        prod = ltorch.sum(prod, 0) if summed else prod
        return _scaled(prod, alpha, alpha_ignores) + _scaled(input, beta)

    fn.__name__ = fn.__qualname__ = name
    return fn


def _scaled(t, factor, zero_ignores: bool = True):
    """``factor * t``; ``t`` itself for 1, and for 0 (where ``zero_ignores``) zeros that
    keep ``t``'s gradient (zeros) whatever ``t`` holds."""
    import thunder.torch as ltorch

    if _is_one(factor):
        return t
    if zero_ignores and _is_zero(factor):
        return ltorch.where(ltorch.full_like(t, True, dtype=torch.bool), 0, t)
    return t * factor


def _is_one(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


def _is_zero(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0
