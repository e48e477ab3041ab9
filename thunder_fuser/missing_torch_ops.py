"""Tensor methods thunder 0.2.6 cannot trace, defined the way thunder defines their
siblings, so user programs that call them jit at all.

``Tensor.fill_`` is missing from thunder 0.2.6 (``zero_`` exists): tracing ``x.fill_(v)``
raises ``AttributeError: Unknown attribute fill_`` with every executor. It is defined here
as thunder defines ``zero_``: a copy of ``full_like(x, v)`` into ``x``, tagged in-place so
thunder's functionalization and our ``copy_to_out_`` rewrite see it like any other.
"""

from __future__ import annotations

import torch


def register_missing_torch_ops() -> None:
    import thunder.torch as ltorch
    from thunder.core import prims
    from thunder.torch.langctx import _method_name_to_fn_map

    if "fill_" in _method_name_to_fn_map:
        return  # registered already, or a newer thunder has it

    @ltorch.torchsymbol(torch.Tensor.fill_, is_method=True, id="torch.Tensor.fill_", tags=(prims.OpTags.IN_PLACE,), out_of_place=ltorch.full_like)
    def fill_(a, value):
        return ltorch._copy_(a, ltorch.full_like(a, value))

    # thunder's jit copied the torch-to-thunder map into its lookaside table at import:
    # add the entry there too, so ``torch.Tensor.fill_(x, v)`` called as a function traces
    from thunder.core import jit_ext

    wrap = jit_ext.ensure_recursive_proxies(jit_ext.interpreter_needs_wrap(jit_ext.record_source_loc_in_symbol_header(fill_)))
    jit_ext._general_jit_lookaside_map[torch.Tensor.fill_] = wrap
