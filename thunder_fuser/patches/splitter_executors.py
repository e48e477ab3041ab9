"""ThunderFX's splitter asks the executors its pieces will run with.

thunder's ``ThunderCompiler`` decides which nodes of Dynamo's graph thunder takes by running
each op's meta, and its gradient's where the op needs one (``try_execute_thunder_symbol``,
``thunder/dynamo/utils.py``). It runs them under a ``CompileData`` of thunder's default
executors, whatever executors the compiler was given. On a GPU thunder's ``sdpa_ex`` claims
``scaled_dot_product_attention`` with a mask, and its gradient rule refuses a mask broadcast
over the batch (``grad_forward_sdpa: Expected all inputs to have same batch_size``), so
every such attention (litgpt's sliding-window layers: Mistral, Phi-3) went to an Inductor
piece between two thunder pieces, though our attention executor (cuDNN, which reads the bias
broadcast) takes it. The check also disagreed with what runs the other way: an op thunder's
defaults pass and the compiler's executors refuse went to ``thunder.jit`` and failed there.

Here the splitter's check runs under the executors the ``ThunderCompiler`` was given
(``executors=...``), so what it asks is what will run. A compiler given none keeps thunder's
defaults, as before. (For our attention executor to say yes there, it reads the splitter's
number proxies as numbers: ``attention._known``.)
"""

from __future__ import annotations

import functools

from thunder_fuser.patches.wrap import wrap_once


def ask_the_compilers_executors() -> bool:
    """Wrap the splitter's meta check; False where thunder is not as expected."""
    try:
        import thunder.common as common
        import thunder.dynamo.utils as dynamo_utils
        from thunder.extend import resolve_executors
    except ImportError:
        return False
    if not hasattr(common, "CompileData"):
        return False

    def wrap(check):
        @functools.wraps(check)
        def check_with_executors(symbol, node, thunder_options):
            executors = (thunder_options or {}).get("executors")
            if not executors:
                return check(symbol, node, thunder_options)
            resolved = tuple(resolve_executors(executors))
            real = common.CompileData
            # the check imports ``CompileData`` from ``thunder.common`` at each call: for its
            # call, that name makes one with the compiler's executors
            common.CompileData = functools.partial(real, executors_list=resolved)
            try:
                return check(symbol, node, thunder_options)
            finally:
                common.CompileData = real

        return check_with_executors

    return wrap_once(dynamo_utils, "try_execute_thunder_symbol", wrap)
