"""``torch.addmm``, ``addmv`` and ``addbmm`` as thunder's own matmul and add.

thunder 0.2.6 has no symbol of its own for these three: it registers them automatically,
as an opaque call to torch whose backward (``addmm_vjp``) runs ``torch.autograd.functional.vjp``,
which computes the forward again under torch's autograd and differentiates it there. Every
call so pays a second matmul, torch's bias sum and a copy outside any region, and the host
time of building and walking an autograd graph. transformers' GPT-2 (its ``Conv1D`` is an
``addmm``) ran four a layer: at 12 layers on the H200 that was 1.1 ms of matmul, 1.3 ms of
torch's sums and copies, and a step twice as long as torch.compile's on the host.

They are defined here as thunder defines ``baddbmm``, their batched sibling: ``alpha`` times
the product plus ``beta`` times the input, a factor of 1 left out. thunder's autodiff then
differentiates the matmul (gradients in the operands' own layouts) and the bias's gradient
is a column sum our reductions take beside their neighbours. As torch documents, ``beta=0``
ignores the input (a NaN in it does not reach the result).
"""

from __future__ import annotations

import torch


def register_matmul_adds() -> None:
    import thunder.torch as ltorch

    from thunder_fuser.patches.missing_torch_ops import _traced_as

    for torchfn, method, product in ((torch.addmm, torch.Tensor.addmm, _mm), (torch.addmv, torch.Tensor.addmv, _mv),
                                     (torch.addbmm, torch.Tensor.addbmm, _bmm_summed)):
        name = torchfn.__name__
        if getattr(ltorch._torch_to_thunder_function_map.get(torchfn), "id", None) == f"thunder_fuser.{name}":
            continue  # registered already
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
