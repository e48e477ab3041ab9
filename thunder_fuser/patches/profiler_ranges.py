"""A ``torch.profiler.record_function`` range inside a jitted function traces as nothing.

torch's ``Optimizer.step`` runs inside ``torch.autograd.profiler.record_function(...)`` (the
range a profiler shows as ``Optimizer.step#AdamW.step``). Entering the range calls the
custom op ``torch.ops.profiler._record_function_enter_new``, which thunder 0.2.6's
interpreter refuses (``profiler._record_function_enter_new is not registered``), any
function that marks a range for the profiler (a model's own ``with record_function("attention"):``)
failed ``thunder.jit`` with every executor; so did ``thunder.jit(optimizer.step)`` for every
torch optimizer, at its first line.

A range names time in a profile; a trace replaces the Python that would have marked it, and
its regions carry their own ranges where asked (``THUNDER_FUSER_RANGES``). Entering and
leaving a ``record_function`` are looked aside here to nothing, as Dynamo does: the range is
not in the trace, everything inside it is.
"""

from __future__ import annotations

import torch


def trace_ranges_as_nothing() -> bool:
    from thunder.core import jit_ext
    from thunder.core.interpreter import ProvenanceRecord, PseudoInst, wrap

    ranges = torch.autograd.profiler.record_function
    present = jit_ext._general_jit_lookaside_map.get(ranges.__enter__)
    if present is not None:
        return getattr(present, "thunder_fuser", False)  # ours, applied before; else a newer thunder's

    def enter(rf):
        return rf

    enter.thunder_fuser = True

    def exit_(rf, *exc):
        return wrap(None, provenance=ProvenanceRecord(PseudoInst.LOOKASIDE, inputs=[rf.provenance]))

    jit_ext._general_jit_lookaside_map[ranges.__enter__] = enter
    jit_ext._general_jit_lookaside_map[ranges.__exit__] = exit_
    return True
