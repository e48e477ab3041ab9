"""``thunder.jit(optimizer.step, ...)`` of torch's ``Adam``, ``AdamW`` or ``SGD`` runs.

thunder 0.2.6 fails tracing any torch optimizer's ``step`` (``Unknown attribute is_sparse``
on a gradient's proxy; past that, the state dict keyed by parameter finds nothing for a
proxy and a trace would build the state afresh each call). With this patch ``thunder.jit``
given such a ``step`` (bound, or under an lr scheduler's wrapper) returns ``optimizers.jitted_step.JittedOptimizerStep``: the
host part of torch's step on the host, every update through ``thunder.jit`` with the same
arguments (executors, transforms). Any other function goes to thunder's ``jit`` as before.
"""

from __future__ import annotations

import functools

from thunder_fuser.patches.wrap import wrap_once


def jit_torch_optimizer_steps() -> bool:
    import thunder

    def wrap(jit):
        @functools.wraps(jit)
        def jit_or_optimizer_step(fn, /, *args, **kwargs):
            from thunder_fuser.optimizers.jitted_step import JittedOptimizerStep, kind_of, optimizer_of

            opt = optimizer_of(fn)
            kind = kind_of(opt)
            if kind is None or args:
                return jit(fn, *args, **kwargs)
            return JittedOptimizerStep(opt, kind, jit, **kwargs)

        return jit_or_optimizer_step

    return wrap_once(thunder, "jit", wrap)
