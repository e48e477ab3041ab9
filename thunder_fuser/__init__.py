"""thunder_fuser: a fusion executor for lightning-thunder.

``thunder.jit(fn, executors=[fuser_ex])`` claims elementwise, cast, reduction, view, resize
and in-place regions of a trace, segments them into kernels, and runs them (CuTe DSL
kernels on CUDA where built, the torch reference backend elsewhere). ``attention_ex`` runs
``scaled_dot_product_attention`` beside them (cuDNN's on CUDA); ``executors()`` lists what
a model needs, in order: ``thunder.jit(model, executors=thunder_fuser.executors())``.
"""

from thunder_fuser._compat import restore_named_tensor_stubs

restore_named_tensor_stubs()  # must run before thunder is imported

import warnings  # noqa: E402

with warnings.catch_warnings():  # thunder's, on every import without transformer_engine: not ours to show
    warnings.filterwarnings("ignore", message="transformer_engine module not found")
    import thunder  # noqa: E402, F401

from thunder_fuser.attention import attention_ex  # noqa: E402
from thunder_fuser.patches.compile_gc import hold_gc_while_compiling  # noqa: E402
from thunder_fuser.executor import fuser_ex  # noqa: E402
from thunder_fuser.inspect.explain import explain  # noqa: E402
from thunder_fuser.cudagraphs.graphs import graphed  # noqa: E402
from thunder_fuser.patches.interpreter_speedups import speed_up_thunders_interpreter  # noqa: E402
from thunder_fuser.patches.meta_dummy import cheapen_thunders_meta_dummies  # noqa: E402
from thunder_fuser.patches.missing_torch_ops import register_missing_torch_ops  # noqa: E402
from thunder_fuser.patches import apply_patches, chosen  # noqa: E402
from thunder_fuser.optimizers.jit_patch import jit_torch_optimizer_steps  # noqa: E402

register_missing_torch_ops()
cheapen_thunders_meta_dummies()
speed_up_thunders_interpreter()
hold_gc_while_compiling()
apply_patches()
if chosen("jit_optimizer_step"):
    jit_torch_optimizer_steps()


def executors() -> list:
    """The executors a model runs with: our attention first (cuDNN's on CUDA), thunder's
    ``sdpa_ex`` for the attention calls ours declines (a mask, dropout), then ``fuser_ex``."""
    from thunder.executors.sdpaex import sdpa_ex

    from thunder_fuser.backends.cute import compile_workers

    # on a CUDA machine the workers' imports (8-15 s on the H100 host) then overlap thunder's
    # tracing of the first call rather than follow it
    compile_workers.start_for_cuda()
    return [attention_ex, sdpa_ex, fuser_ex]


def transforms(launch_runs: bool | None = None) -> list:
    """The transforms a model runs with: ``FastPrologue`` checks thunder's inputs in one
    call (``thunder_transforms/prologue.py``), and ``LaunchRuns`` replays the launches of region calls and the
    matmuls between them as one CUDA graph (``thunder_transforms/launch_runs.py``; on a CUDA trace only).
    ``thunder.jit(model, executors=executors(), transforms=transforms())``.

    ``launch_runs`` (default: on, unless ``THUNDER_FUSER_LAUNCH_RUNS=0``): what runs buy
    and what they cost (one cuBLAS workspace per process, 32 MiB on the H100) is in
    ``cudagraphs/launch_run.py``."""
    from thunder_fuser import config
    from thunder_fuser.thunder_transforms.prologue import FastPrologue

    if launch_runs is None:
        launch_runs = config.flag("THUNDER_FUSER_LAUNCH_RUNS")
    if not launch_runs:
        return [FastPrologue()]
    from thunder_fuser.thunder_transforms.launch_runs import LaunchRuns

    return [FastPrologue(), LaunchRuns()]


__all__ = ["attention_ex", "executors", "explain", "fuser_ex", "graphed", "transforms"]
