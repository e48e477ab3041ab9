"""Ops thunder 0.2.6 registers automatically, defined here as thunder's own.

thunder has no symbol of its own for many torch ops: it registers them automatically (tag
``AUTO_REGISTERED``), as an opaque call to torch that no fusion executor can join, whose
backward (``<op>_vjp``) runs ``torch.autograd.functional.vjp``: the forward computed again
under torch's autograd and differentiated there. Every call pays the forward twice, torch's
kernels outside any region, and the host time of building and walking an autograd graph.
``tests/test_auto_registered_ops.py`` walks every zoo model's traces for such an op.

- ``torch.addmm``, ``addmv`` and ``addbmm``: transformers' GPT-2 (its ``Conv1D`` is an
  ``addmm``) ran four a layer; at 12 layers on the H200 that was 1.1 ms of matmul, 1.3 ms of
  torch's sums and copies, and a step twice as long as torch.compile's on the host. Defined
  as thunder defines ``baddbmm``, their batched sibling: ``alpha`` times the product plus
  ``beta`` times the input, a factor of 1 left out. thunder's autodiff then differentiates
  the matmul (gradients in the operands' own layouts) and the bias's gradient is a column
  sum our reductions take beside their neighbours. As torch documents, ``beta=0`` ignores
  the input (a NaN in it does not reach the result).
- ``Tensor.bool``, ``byte``, ``char``, ``short``, ``int``, ``half``, ``bfloat16``, ``double``:
  a dtype conversion (a sliding-window mask's ``.bool()`` in litgpt's Mistral, Phi-3 and
  Gemma-2) as thunder defines ``Tensor.long``, a ``to`` our kernels fuse.
"""

from __future__ import annotations

import torch


CONVERSIONS = {"bool": torch.bool, "byte": torch.uint8, "char": torch.int8, "short": torch.int16, "int": torch.int32,
               "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}


def define_auto_registered_ops() -> None:
    _define_matmul_adds()
    _define_conversions()


def _define_conversions() -> None:
    import thunder.torch as ltorch

    from thunder_fuser.patches.missing_torch_ops import _traced_as

    for name, dtype in CONVERSIONS.items():
        method = getattr(torch.Tensor, name)
        if getattr(ltorch._torch_to_thunder_function_map.get(method), "id", None) == f"thunder_fuser.Tensor.{name}":
            continue  # defined already
        sym = ltorch.torchsymbol(method, method_name=name, id=f"thunder_fuser.Tensor.{name}")(_conversion(name, dtype))
        _traced_as(method, sym)


def _conversion(name: str, dtype):
    def fn(a, /, memory_format=torch.preserve_format):
        import thunder.torch as ltorch

        return ltorch.to(a, dtype=dtype, memory_format=memory_format)

    fn.__name__ = fn.__qualname__ = f"to_{name}"
    return fn


def _define_matmul_adds() -> None:
    import thunder.torch as ltorch

    from thunder_fuser.patches.missing_torch_ops import _traced_as

    for torchfn, method, product in ((torch.addmm, torch.Tensor.addmm, _mm), (torch.addmv, torch.Tensor.addmv, _mv),
                                     (torch.addbmm, torch.Tensor.addbmm, _bmm_summed)):
        name = torchfn.__name__
        if getattr(ltorch._torch_to_thunder_function_map.get(torchfn), "id", None) == f"thunder_fuser.{name}":
            continue  # defined already
        sym = ltorch.torchsymbol(torchfn, method, method_name=name, id=f"thunder_fuser.{name}")(_scaled_sum(name, product))
        _traced_as(torchfn, sym)
        _traced_as(method, sym)


def _scaled_sum(name: str, product):
    def fn(input, a, b, *, beta=1, alpha=1, out=None):
        from thunder.core import utils

        utils.check(out is None, lambda: f"torch.{name}: out= is not supported", NotImplementedError)
        prod = product(name, a, b)
        prod = prod if _is_one(alpha) else prod * alpha
        if _is_zero(beta):
            return prod
        return prod + (input if _is_one(beta) else input * beta)

    fn.__name__ = fn.__qualname__ = name
    return fn


def _mm(name, a, b):
    import thunder.torch as ltorch
    from thunder.core import utils

    utils.check(a.ndim == 2 and b.ndim == 2, lambda: f"torch.{name}: mat1 and mat2 must be 2-D, got {a.ndim}-D and {b.ndim}-D")
    return ltorch.matmul(a, b)


def _mv(name, a, b):
    import thunder.torch as ltorch
    from thunder.core import utils

    utils.check(a.ndim == 2 and b.ndim == 1, lambda: f"torch.{name}: mat must be 2-D and vec 1-D, got {a.ndim}-D and {b.ndim}-D")
    return ltorch.matmul(a, b)


def _bmm_summed(name, a, b):
    import thunder.torch as ltorch
    from thunder.core import utils

    utils.check(a.ndim == 3 and b.ndim == 3, lambda: f"torch.{name}: batch1 and batch2 must be 3-D, got {a.ndim}-D and {b.ndim}-D")
    return ltorch.sum(ltorch.matmul(a, b), 0)


def _is_one(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


def _is_zero(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0
