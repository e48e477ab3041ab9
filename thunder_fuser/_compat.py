"""Make lightning-thunder 0.2.6 importable on torch releases that dropped named tensors.

thunder's op table (``thunder/torch/default_torch_ops.py``) references the named-tensor
methods of ``torch.Tensor`` at import time. torch 2.13 removed them, so ``import thunder``
fails with ``AttributeError: ... 'align_as'``. We restore each missing method as a stub
that raises, which is all thunder needs (it only uses them as dictionary keys), and we
touch nothing on a torch that still has them.
"""

from __future__ import annotations

import torch

NAMED_TENSOR_METHODS = ("align_as", "align_to", "refine_names", "rename", "rename_", "has_names")


def _make_stub(name: str):
    def stub(self, *args, **kwargs):
        raise RuntimeError(f"torch.Tensor.{name}: named tensors were removed from this torch release")

    stub.__name__ = name
    stub.__qualname__ = f"Tensor.{name}"
    return stub


def restore_named_tensor_stubs() -> tuple[str, ...]:
    """Add a stub for every named-tensor method this torch lacks; return the names added."""
    added = []
    for name in NAMED_TENSOR_METHODS:
        if not hasattr(torch.Tensor, name):
            setattr(torch.Tensor, name, _make_stub(name))
            added.append(name)
    return tuple(added)


def thunder_0_2_6(switch: str):
    """thunder, where a patch of ours read from its 0.2.6 source may go on it: None where
    the environment variable ``switch`` is ``0``, thunder is missing, or it is another
    release (the patches check the functions they replace as well)."""
    from thunder_fuser import config

    if not config.flag(switch):
        return None
    try:
        import thunder
    except ImportError:
        return None
    return thunder if getattr(thunder, "__version__", None) == "0.2.6" else None
