"""Dynamo's fused multiply-add, traced as thunder's multiply and add.

Dynamo decomposes ``x.addcmul_(a, b, value=v)``, ``x.addcdiv_(a, b, value=v)`` and
``x.add_(y, alpha=tensor)`` into ``torch.ops.prims.fma(p, v, x)`` (Inductor's prim:
``p * v + x``) followed by ``x.copy_``, in the graph it hands a backend
(``torch/_dynamo/variables/tensor.py``, ``enable_dynamo_decompositions``). thunder 0.2.6 has
no mapping for that prim, so ThunderFX's splitter hands every one to Inductor: a torch
optimizer's single-tensor step (``foreach=False``, torch's default on the CPU) came apart at
each parameter's ``exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)``, one thunder
piece and one Inductor piece per parameter.

Mapped here to ``mul`` then ``add`` as thunder traces them (computed in fp32 for 16-bit
inputs, rounded once at the end, as torch's own ``addcmul_`` computes), so the whole step is
one piece and our regions take it.
"""

from __future__ import annotations

import importlib

import torch


def _fma_torch(a, b, c):
    return a * b + c


def _fma_thunder(a, b, c):
    import thunder.torch as ltorch

    return ltorch.add(ltorch.mul(a, b), c)


def register_dynamo_fma() -> bool:
    """Map ``torch.ops.prims.fma`` for thunder's interpreter and ThunderFX's splitter;
    whether it is mapped (torch without the prim: nothing to map)."""
    from thunder.core import jit_ext
    from thunder.core.interpreter import _interpret_call
    from thunder.torch import _torch_to_thunder_function_map

    try:
        importlib.import_module("torch._inductor.inductor_prims")  # defines the prim
    except ImportError:
        return False
    fma = getattr(getattr(torch.ops.prims, "fma", None), "default", None)
    if fma is None:
        return False
    if fma in _torch_to_thunder_function_map:
        return True
    _torch_to_thunder_function_map[fma] = _fma_thunder
    jit_ext._general_jit_lookaside_map[fma] = lambda a, b, c: _interpret_call(_fma_torch, a, b, c)
    return True
