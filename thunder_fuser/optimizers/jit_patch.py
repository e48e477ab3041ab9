"""``thunder.jit(optimizer.step, ...)`` of torch's ``Adam``, ``AdamW`` or ``SGD`` runs.

thunder 0.2.6 fails tracing any torch optimizer's ``step`` (``Unknown attribute is_sparse``
on a gradient's proxy; past that, the state dict keyed by parameter finds nothing for a
proxy and a trace would build the state afresh each call). With this patch ``thunder.jit``
given such a ``step`` (bound, or under an lr scheduler's wrapper) returns ``optimizers.jitted_step.JittedOptimizerStep``: the
host part of torch's step on the host, every update through ``thunder.jit`` with the same
arguments (executors, transforms). Any other function goes to thunder's ``jit`` as before.

Without ``transforms=`` the update gets ``FastPrologue``: thunder's own prologue checks each
of a step's hundreds of tensors in Python, about as long as the whole update's host work
(CPU, 200 parameters: 106 against 65 ms a step). It is a patch of thunder like those in
``patches/`` (``THUNDER_FUSER_PATCHES`` names it ``jit_optimizer_step``), applied from the
package's import because it reaches this late stage.
"""

from __future__ import annotations

import functools

from thunder_fuser.optimizers.jitted_step import JittedOptimizerStep, kind_of, optimizer_of
from thunder_fuser.patches.wrap import wrap_once
from thunder_fuser.thunder_transforms.prologue import FastPrologue


def jit_torch_optimizer_steps() -> bool:
    import thunder

    def wrap(jit):
        @functools.wraps(jit)
        def jit_or_optimizer_step(fn, /, *args, **kwargs):
            opt = optimizer_of(fn)
            kind = kind_of(opt)
            if kind is None or args:
                return jit(fn, *args, **kwargs)
            if kwargs.get("transforms") is None:
                kwargs["transforms"] = [FastPrologue()]
            return JittedOptimizerStep(opt, kind, jit, **kwargs)

        return jit_or_optimizer_step

    return wrap_once(thunder, "jit", wrap)
