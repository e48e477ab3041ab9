"""``copy_to_out_(computed, *, out)``: the in-place write primitive thunder 0.2.6 lacks.

Contract (from the thunder PR "Add prims.copy_to_out_"): ``computed`` is an intermediate
used solely by this copy, so ``out`` may take ``computed``'s place: the kernel that
computes it stores straight into ``out``, with no extra buffer and no extra pass. The
result is ``out`` itself. Our functionalization pass only emits it where that contract
holds, and keeps a real ``prims.copy_`` elsewhere.
"""

from __future__ import annotations

import torch
from thunder.core import prims
from thunder.core.proxies import TensorProxy
from thunder.core import codeutils, utils

COPY_TO_OUT_ID = "thunder_fuser.copy_to_out_"


def _copy_to_out_meta(computed: TensorProxy, /, *, out: TensorProxy) -> TensorProxy:
    utils.check_type(computed, TensorProxy)
    utils.check_type(out, TensorProxy)
    utils.check(
        computed.shape == out.shape,
        lambda: f"copy_to_out_: shape of {computed.name} {computed.shape} differs from out={out.name} {out.shape}",
    )
    utils.check(
        computed.device == out.device,
        lambda: f"copy_to_out_: {computed.name} is on {computed.device}, out={out.name} on {out.device}",
    )
    return TensorProxy(like=out)


def _copy_to_out_impl(computed: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    out.copy_(computed)
    return out


def _print_copy_to_out_(bsym, out_printables, arg_printables, kwarg_printables) -> str:
    """Print as ``t1 = copy_to_out_(t0, out=q)``: short enough to read inside a region."""
    (computed,) = arg_printables
    out = kwarg_printables["out"]
    pp = codeutils.prettyprint
    return (
        f"{pp(out_printables, literals_as_underscores=True)} = copy_to_out_({pp(computed)}, out={pp(out)})"
        f"  # {pp(out_printables, with_type=True)}"
    )


copy_to_out_ = prims.make_prim(
    COPY_TO_OUT_ID,
    "copy_to_out_",
    meta=_copy_to_out_meta,
    python_printer=_print_copy_to_out_,
    python_impl=_copy_to_out_impl,
    tags=(prims.OpTags.DONT_DCE, prims.OpTags.IN_PLACE),
)

__all__ = ["copy_to_out_", "COPY_TO_OUT_ID"]
