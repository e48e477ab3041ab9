"""Where one of ``model_ops_probe``'s or ``long_rows_probe``'s cases spends its GPU time,
per contender (dev aid; GPU machine): the kernels of a few calls under torch.profiler,
grouped by name, for torch.compile and thunder+fuser, and whether each call could be
timed from a CUDA graph. Usage: python scripts/ops_profile.py "case name" ["case" ...]
(a name's prefix is enough)."""
import sys

import thunder_fuser  # noqa: F401
import thunder
import torch

from benchmarks.timing import device_ms
from scripts.block_profile import kernel_table
from scripts.long_rows_probe import CASES as LONG_ROWS
from scripts.model_ops_probe import _compiled, cases
from thunder_fuser import fuser_ex


def main():
    torch.manual_seed(0)
    known = {**cases("cuda", False), **LONG_ROWS}
    for prefix in sys.argv[1:]:
        name = next(n for n in known if n.startswith(prefix))
        fn, make = known[name]
        args = make()
        for kind, jit in (("torch.compile", torch.compile),
                          ("thunder+fuser", lambda f: thunder.jit(f, executors=[fuser_ex]))):
            cfn = _compiled(fn, jit)
            ms, graph = device_ms(cfn, [args])
            print(f"== {name}, {kind}: {ms:.4f} ms (graph: {graph})")
            kernel_table(lambda a: cfn(*a), args)


if __name__ == "__main__":
    main()
