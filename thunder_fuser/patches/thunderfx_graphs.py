"""ThunderFX on current torch: each piece of Dynamo's graph handed to ``thunder.jit`` with its
code generated.

thunder's ``ThunderCompiler`` (the ``torch.compile`` backend) splits Dynamo's graph with
torch's ``split_module`` and jits each piece thunder supports. Since torch 2.6 a graph module
Dynamo makes generates its Python code lazily (``_LazyGraphModule``), on its first call; thunder
0.2.6 regenerates the whole graph's code before splitting, but not each piece's, so its
interpreter ran torch.fx's code generation itself on the first call and failed on every graph
(``TypeError: object of type 'MappingKeysView' has no len()``, in ``delete_unused_values``).
Here each piece's code is generated (thunder's own ``recompile_graph``) before it is jitted.
"""

from __future__ import annotations

from thunder_fuser.patches.wrap import wrap_once


def generate_each_pieces_code() -> bool:
    """Wrap the splitter ``ThunderCompiler`` calls; False where thunder is not as expected."""
    try:
        import thunder.dynamo.compiler as compiler
        from thunder.dynamo.utils import recompile_graph
    except ImportError:
        return False

    def wrap(splitter):
        def _splitter(gm, thunder_jit, *args, **kwargs):
            def jit(graph_module, *a, **k):
                recompile_graph(graph_module)
                return thunder_jit(graph_module, *a, **k)

            return splitter(gm, jit, *args, **kwargs)

        return _splitter

    return wrap_once(compiler, "_splitter", wrap)
