"""thunder_fuser: a fusion executor for lightning-thunder.

``thunder.jit(fn, executors=[fuser_ex])`` claims elementwise, cast, reduction, view, resize
and in-place regions of a trace, segments them into kernels, and runs them (CuTe DSL
kernels on CUDA where built, the torch reference backend elsewhere).
"""

from thunder_fuser._compat import restore_named_tensor_stubs

restore_named_tensor_stubs()  # must run before thunder is imported

from thunder_fuser.executor import fuser_ex  # noqa: E402
from thunder_fuser.explain import explain  # noqa: E402
from thunder_fuser.missing_torch_ops import register_missing_torch_ops  # noqa: E402

register_missing_torch_ops()

__all__ = ["fuser_ex", "explain"]
