"""A cheaper dummy for thunder's autograd connection.

thunder 0.2.6 ties a jitted function into torch autograd through two ``autograd.Function``
classes (``thunder/executors/torch_autograd.py``), which make their dummy output and dummy
gradient with ``torch.randn(1, device="meta")``: on the meta device randn runs torch's
Python reference implementation, about 22 us on a CPU host (``torch.empty``: 1 us), twice
per training step. A meta tensor holds no values, so an empty one is the same tensor. We
give that module a ``torch`` whose ``randn`` makes meta tensors with ``empty`` and is torch
in everything else; nothing else of thunder changes.
"""

from __future__ import annotations

import types

import torch


class _TorchWithCheapMetaRandn(types.ModuleType):
    def __getattr__(self, name):  # what torch provides lazily (its module __getattr__)
        return getattr(torch, name)

    @staticmethod
    def randn(*size, device=None, requires_grad=False, **kwargs):
        if not kwargs and str(device) == "meta":
            return torch.empty(*size, device="meta", requires_grad=requires_grad)
        return torch.randn(*size, device=device, requires_grad=requires_grad, **kwargs)


def cheapen_thunders_meta_dummies() -> bool:
    """Point thunder's autograd glue at the cheaper randn; False where thunder's module is not
    as expected (it is left as it is)."""
    try:
        import thunder.executors.torch_autograd as glue
    except ImportError:
        return False
    if getattr(glue, "torch", None) is not torch:
        return isinstance(getattr(glue, "torch", None), _TorchWithCheapMetaRandn)
    proxy = _TorchWithCheapMetaRandn("torch")
    proxy.__dict__.update({k: v for k, v in torch.__dict__.items() if k != "randn"})
    glue.torch = proxy
    return True
