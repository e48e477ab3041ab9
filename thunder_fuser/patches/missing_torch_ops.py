"""Tensor methods thunder 0.2.6 cannot trace, defined the way thunder defines their
siblings, so user programs that call them jit at all.

``Tensor.fill_`` is missing from thunder 0.2.6 (``zero_`` exists): tracing ``x.fill_(v)``
raises ``AttributeError: Unknown attribute fill_`` with every executor. It is defined here
as thunder defines ``zero_``: a copy of ``full_like(x, v)`` into ``x``, tagged in-place so
thunder's functionalization and our ``copy_to_out_`` rewrite see it like any other.

``tensor % n`` fails with every executor (``'NoneType' object is not callable``): thunder's
proxy looks up a ``mod`` method that 0.2.6 never registers. It is ``remainder``, as in torch.

``F.scaled_dot_product_attention(..., enable_gqa=True)`` (grouped-query attention, as
current PyTorch spells it) fails with every executor (``unexpected keyword argument
'enable_gqa'``): thunder's symbol predates the argument. It is translated here: key and
value repeated per query head as torch's reference does (``repeat_interleave`` over the
heads), then thunder's own symbol, which every attention executor claims.
"""

from __future__ import annotations

import torch

from thunder_fuser.patches.wrap import traced_as


def register_missing_torch_ops() -> None:
    _register_fill_()
    _register_mod()
    _register_enable_gqa()


def _register_fill_() -> None:
    import thunder.torch as ltorch
    from thunder.core import prims
    from thunder.torch.langctx import _method_name_to_fn_map

    if "fill_" in _method_name_to_fn_map:
        return  # registered already, or a newer thunder has it

    @ltorch.torchsymbol(torch.Tensor.fill_, is_method=True, id="torch.Tensor.fill_", tags=(prims.OpTags.IN_PLACE,), out_of_place=ltorch.full_like)
    def fill_(a, value):
        return ltorch._copy_(a, ltorch.full_like(a, value))

    traced_as(torch.Tensor.fill_, fill_)


def _register_mod() -> None:
    import thunder.torch as ltorch
    from thunder.torch.langctx import _method_name_to_fn_map, register_method

    if "mod" not in _method_name_to_fn_map:
        register_method("mod", ltorch.remainder)


def _register_enable_gqa() -> None:
    import inspect

    import thunder.torch as ltorch

    sdpa = ltorch.scaled_dot_product_attention
    if "enable_gqa" in inspect.signature(sdpa.meta).parameters:
        return  # a newer thunder takes it
    if ltorch._torch_to_thunder_function_map.get(torch.nn.functional.scaled_dot_product_attention) is not sdpa:
        return  # registered already

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                     enable_gqa=False):
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            repeats = query.shape[-3] // key.shape[-3]
            key, value = (_repeat_heads(t, repeats) for t in (key, value))
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)

    ltorch.register_function(torch.nn.functional.scaled_dot_product_attention, scaled_dot_product_attention)
    traced_as(torch.nn.functional.scaled_dot_product_attention, scaled_dot_product_attention)


def _repeat_heads(t, repeats: int):
    """``t.repeat_interleave(repeats, dim=-3)`` of ``[..., heads, seq, dim]``, as an expand and
    a reshape (thunder's ``repeat_interleave`` takes no dim)."""
    import thunder.torch as ltorch

    *batch, heads, seq, dim = t.shape
    spread = ltorch.unsqueeze(t, -3)
    spread = ltorch.expand(spread, (*batch, heads, repeats, seq, dim))
    return ltorch.reshape(spread, (*batch, heads * repeats, seq, dim))
