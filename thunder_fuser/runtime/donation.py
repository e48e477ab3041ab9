"""The run-time half of writing an output over a dead input (``passes/dead_inputs.py``): a tensor
the trace deems dead may still be held elsewhere (the caller kept the logits it returned, a
view shares its storage), so the generated code (``straight_line.py``) writes over it only
where ``donated`` finds it held by the trace alone, and otherwise allocates as before.

"Held by the trace alone": its Python reference count is exactly the references the call
path itself makes (the trace's local, the call's argument tuple, the generated code's
local, ...), which ``STRUCTURAL_REFS`` measures once on this interpreter through the same
path (``RegionRunner``); no other tensor shares its storage (the storage's use count); it
is no view, does not require grad, starts its storage, and its pointer is 64-byte aligned,
as a fresh allocation's is (the generated code assumes both of a tensor it allocates: a
kernel's vector accesses may need 32 bytes).
"""

from __future__ import annotations

import sys

import torch
from thunder_fuser import config

_storage_use_count = torch._C._storage_Use_Count


def donating() -> bool:
    """On unless ``THUNDER_FUSER_DONATE=0``. On the H100 it brings pythia-410m's step peak
    from 537 to 443 MiB over the step's start (torch.compile: 447) at the same step time:
    the loss backward writes the logits' gradient over the logits."""
    return config.flag("THUNDER_FUSER_DONATE")


def _refs(t) -> int:  # shaped as ``donated``: one frame, the tensor its only argument
    return sys.getrefcount(t)


# the class thunder calls a fusion through: ``runtime/region_runner.py`` names it as it is
# defined (this module comes before it: the runner's generated code calls ``donated``)
RUNNER_CLASS: type | None = None


def _structural_refs() -> int:
    """The reference count ``donated`` sees for a tensor that only the trace holds, called
    through a region runner from a trace's generated code, as thunder calls fusions."""
    seen = []

    def run(args):
        a0, = args
        seen.append(_refs(a0))
        return [a0]

    runner = RUNNER_CLASS.__new__(RUNNER_CLASS)
    runner.fast = run
    glob = {"runner": runner, "empty": torch.empty}
    exec(compile("def computation():\n    t0 = empty(0)\n    (t1,) = runner(t0)\n    del t0\n    return t1\n",
                 "<donation probe>", "exec"), glob)
    glob["computation"]()
    return seen[0]


STRUCTURAL_REFS: int | None = None


def donated(t, wrapped: int = 0) -> bool:
    """May the generated code write an output of ``t``'s layout over ``t``? ``wrapped``: the
    references a wrapper around this call holds (a test's spy)."""
    global STRUCTURAL_REFS
    if STRUCTURAL_REFS is None:
        STRUCTURAL_REFS = _structural_refs()
    return (sys.getrefcount(t) == STRUCTURAL_REFS + wrapped and t._base is None and not t.requires_grad
            and t.storage_offset() == 0 and t.data_ptr() % 64 == 0
            and _storage_use_count(t.untyped_storage()._cdata) == 2)  # t's and the one just made
