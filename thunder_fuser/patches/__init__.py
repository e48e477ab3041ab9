"""What we change in thunder 0.2.6 when ``thunder_fuser`` is imported: each patch corrects
a thunder behaviour that would give a user a wrong result or an error where torch runs, for
every thunder function in the process (ours or not), and says so in its module docstring.

| patch | what it corrects |
| --- | --- |
| ``weak_dtypes`` | a view of a 0-d tensor with dims kept the 0-d tensor's weak dtype (type promotion) |
| ``nll_loss_backward`` | the loss gradient of logits of 3 or more dims, or of a summed fp32 loss, failed or came back in another shape |
| ``scalar_tensor_grads`` | the gradient of a 0-d tensor broadcast by an elementwise op was not summed (silently wrong) |
| ``trace_cache`` | a ``thunder.jit`` function kept every trace it made: bounded by ``THUNDER_FUSER_MAX_TRACES`` |
| ``thunderfx_graphs`` | ``torch.compile(backend=ThunderCompiler(...))`` failed on every graph on torch 2.6 and later |
| ``foreach_ops`` | torch's ``_foreach_*`` ops (an optimizer's step on a GPU) did not trace: ThunderFX gave them to Inductor |
| ``dce_tags`` | thunder's dead-code elimination was quadratic in a fusion's size (its tags gathered per subsymbol) |
| ``dynamo_fma`` | Dynamo's ``prims.fma`` (its ``addcmul_``/``addcdiv_``) went to Inductor: a single-tensor optimizer step came apart per parameter |
| ``alias_keys`` | every call grouped its tensor arguments by storage in a Python loop: a third of an optimizer step's host time |
| ``sequence_lengths`` | a trace made for a list of n tensors also ran for a longer list, on its first n: the rest's in-place updates silently lost |
| ``split_copies`` | ThunderFX kept a stale second copy of every tensor Dynamo's graph held (an optimizer's parameters and states) |
| ``profiler_ranges`` | a ``record_function`` range (every torch optimizer's ``step``) failed ``thunder.jit`` |
| ``jit_optimizer_step`` | ``thunder.jit(optimizer.step)`` of torch's ``Adam``, ``AdamW`` or ``SGD`` failed tracing (a state dict keyed by parameter); in ``optimizers/jit_patch.py``, applied from the package's import |
| ``type_promotion`` | dtypes traced otherwise than torch computes them, and so computed in every executor that runs thunder's prims: a bool tensor with a Python int as int8 (``(x > 0) * 200`` wrapped to -56), ``uint8`` with a 0-d signed tensor as int16, ``bf16 // 3`` as fp32, ``copysign`` in its first operand's dtype |
| ``auto_registered_ops`` | ops thunder registers automatically (``torch.addmm``/``addmv``/``addbmm``, GPT-2's ``Conv1D``; ``Tensor.bool``/``half``/...) ran as opaque torch calls whose backward computed the forward again under torch's autograd; thunder's ``baddbmm`` let a NaN input through ``beta=0`` |
| ``memory_format`` | ``x.to(dtype, memory_format=...)`` lost the format, and ``x.to(memory_format=torch.contiguous_format)`` of a channels-last ``x`` kept channels-last (strides otherwise than torch's in every executor that runs thunder's prims) |
| ``splitter_executors`` | ThunderFX's splitter asked thunder's default executors, not the compiler's, which op thunder takes: on a GPU an attention with a batch-broadcast mask went to Inductor, and an op only the defaults pass failed in ``thunder.jit`` |

``THUNDER_FUSER_PATCHES`` names the patches to apply (default: all of them).
"""

from __future__ import annotations

from thunder_fuser.patches.alias_keys import quick_alias_keys
from thunder_fuser.patches.auto_registered_ops import define_auto_registered_ops
from thunder_fuser.patches.type_promotion import promote_as_torch
from thunder_fuser.patches.dce_tags import linear_dce
from thunder_fuser.patches.dynamo_fma import register_dynamo_fma
from thunder_fuser.patches.foreach_ops import register_foreach_ops
from thunder_fuser.patches.memory_format import lay_out_as_asked
from thunder_fuser.patches.nll_loss_backward import reshape_to_the_logits
from thunder_fuser.patches.profiler_ranges import trace_ranges_as_nothing
from thunder_fuser.patches.scalar_tensor_grads import sum_scalar_tensor_grads
from thunder_fuser.patches.sequence_lengths import key_by_sequence_lengths
from thunder_fuser.patches.split_copies import share_split_tensors
from thunder_fuser.patches.splitter_executors import ask_the_compilers_executors
from thunder_fuser import config
from thunder_fuser.patches.thunderfx_graphs import generate_each_pieces_code
from thunder_fuser.patches.trace_cache import bound_thunders_trace_cache
from thunder_fuser.patches.weak_dtypes import strengthen_dims_dtypes

PATCHES = {"weak_dtypes": strengthen_dims_dtypes, "nll_loss_backward": reshape_to_the_logits,
           "scalar_tensor_grads": sum_scalar_tensor_grads, "trace_cache": bound_thunders_trace_cache,
           "thunderfx_graphs": generate_each_pieces_code, "foreach_ops": lambda: bool(register_foreach_ops()),
           "dynamo_fma": register_dynamo_fma, "dce_tags": linear_dce,
           "alias_keys": quick_alias_keys, "sequence_lengths": key_by_sequence_lengths, "split_copies": share_split_tensors,
           "profiler_ranges": trace_ranges_as_nothing, "splitter_executors": ask_the_compilers_executors,
           "auto_registered_ops": define_auto_registered_ops,
           "type_promotion": promote_as_torch, "memory_format": lay_out_as_asked}


def chosen(name: str) -> bool:
    """Whether ``THUNDER_FUSER_PATCHES`` names the patch ``name`` (or ``all``)."""
    names = config.items("THUNDER_FUSER_PATCHES")
    return "all" in names or name in names


def apply_patches() -> dict[str, bool]:
    """Apply the patches ``THUNDER_FUSER_PATCHES`` names; which took (a patch that finds
    thunder not as expected leaves it)."""
    return {name: patch() for name, patch in PATCHES.items() if chosen(name)}
