"""Kernel names a profile reads: ``fuser_<family>_<the ops it computes>``.

CuTe DSL names a kernel after its Python function and operands
(``kernel_cutlass_kernel_tensorptrbf16_gmem_align16_...``), the same for every kernel of a
family, so a profile of a training step (torch.profiler, Nsight Systems) could not say
which of ours was the norm's backward and which the SwiGLU's, nor put them beside
Inductor's, whose names list the ops they fuse (``triton_red_fused_add_mean_mul_rsqrt_0``).
Each of our kernels is now prefixed the same way: the family, then the distinct ops of its
program in alphabetical order, without the ones every kernel has (conversions, broadcasts).
The DSL keeps its own name after the prefix, so a name stays unique.
"""

from __future__ import annotations

from thunder_fuser.backends.cute.lower.expr import Op, Reduce, Reshaped, Select

# ops nearly every kernel holds, which say nothing about what it computes
_SILENT = frozenset(("convert_element_type", "broadcast_in_dim", "reshape", "shallow_copy"))
MAX_OPS_CHARS = 72  # a name a profiler's table still shows whole


def _ops(e, out: set) -> None:
    if isinstance(e, Op):
        out.add(e.op)
        for a in e.args:
            _ops(a, out)
    elif isinstance(e, Reduce):
        out.add(e.op)
        _ops(e.arg, out)
    elif isinstance(e, Select):
        out.add("cat" if len(e.pieces) > 1 else "pad")  # a pad selects one piece, the rest its fill
        for p in e.pieces:
            _ops(p, out)
    elif isinstance(e, Reshaped):
        _ops(e.expr, out)


def kernel_label(family: str, progs) -> str:
    """``fuser_<family>_<ops>`` for the programs one kernel runs."""
    ops: set = set()
    for prog in progs:
        for st in prog.stores:
            _ops(st.expr, ops)
    text = "_".join(sorted(ops - _SILENT))
    if len(text) > MAX_OPS_CHARS:
        text = text[:MAX_OPS_CHARS].rsplit("_", 1)[0]
    return f"fuser_{family}_{text}" if text else f"fuser_{family}"


def named(kernel, family: str, progs):
    """``kernel`` (a ``cute.kernel``) with its name prefixed by :func:`kernel_label`; as
    it was on a DSL without ``set_name_prefix``."""
    set_prefix = getattr(kernel, "set_name_prefix", None)
    if set_prefix is not None:
        set_prefix(kernel_label(family, progs))
    return kernel
