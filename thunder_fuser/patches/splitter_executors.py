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

The check also runs once per kind of node, not once per node. It builds proxies from each
input's shape, dtype, device and ``requires_grad`` (a new tensor of ones: strides are not
read) and runs the op's meta under them, and for an op on a tensor that requires grad its
whole gradient rule (``value_and_grad``: 135 ms a node on the CPU machine). A model's
layers, and an optimizer's step over them, repeat the same ops on inputs alike in all of
that: ``torch.compile(opt.step, backend=ThunderCompiler(...))`` of AdamW over transformers'
GPT-2 at 2 layers (tiny, CPU) asked it 560 times for 99 kinds of node, and its first step
took 18.0 s, 15.1 s with each kind checked once; a model at full depth asks it per layer.
A node passes unchecked where its op, symbol, inputs as the check reads them (each tensor's
shape, dtype, device and ``requires_grad``; each number, string or dtype as it is) and
options (the executors by name, ``disable_torch_autograd``, torch's default dtype and
device) are those of a node that passed. A node that failed is checked again, so that its
reason names it. A node with an input the check reads otherwise (a submodule, an object
without an example value, a symbolic number without a hint) is always checked.
"""

from __future__ import annotations

import functools

import torch

from thunder_fuser.patches.wrap import wrap_once

_MAX_PASSED = 65_536  # the nodes' kinds remembered as passing (a bound, never reached by a model)
_passed: dict = {}  # key -> the symbol (held, so that its id in the key is not reused)
_SCALARS = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout,
            type(Ellipsis))


class _Unkeyed(Exception):
    """An input the check reads otherwise than by the parts a key holds."""


def _tensor_key(t) -> tuple:
    return ("tensor", tuple(int(d) for d in t.shape), t.dtype, t.device, bool(t.requires_grad))


def _input_key(arg):
    """What ``get_proxy_inputs_from_node`` reads of one input (and its nested inputs)."""
    if isinstance(arg, torch.fx.Node):
        if arg.op == "get_attr" and isinstance(getattr(arg.graph.owning_module, arg.target, None), torch.nn.Module):
            raise _Unkeyed  # the check hands the module itself to the op
        if "example_value" not in arg.meta:
            raise _Unkeyed
        value = arg.meta["example_value"]
        if isinstance(value, torch.Tensor):
            return _tensor_key(value)
        if isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
            return ("tensors", tuple(_tensor_key(v) for v in value))
        if isinstance(value, torch.types.py_sym_types) and value.node.has_hint():
            return ("symbol", type(value).__name__, value.node.hint)
        raise _Unkeyed
    if isinstance(arg, (list, tuple)):
        return (type(arg).__name__, tuple(_input_key(a) for a in arg))
    if isinstance(arg, dict):
        return ("dict", tuple((k, _input_key(v)) for k, v in arg.items()))
    if isinstance(arg, slice):
        return ("slice", _input_key(arg.start), _input_key(arg.stop), _input_key(arg.step))
    if isinstance(arg, _SCALARS):
        return (type(arg), arg)
    raise _Unkeyed


def _check_key(symbol, node, executors, thunder_options) -> tuple | None:
    """The node's kind as the check reads it, or None where it reads more."""
    try:
        inputs = _input_key((node.args, node.kwargs))
        hash(node.target)
    except (_Unkeyed, TypeError):
        return None
    return (id(symbol), node.target, inputs, executors, (thunder_options or {}).get("disable_torch_autograd"),
            torch.get_default_dtype(), str(torch.get_default_device()))


def _checked(check, symbol, node, thunder_options, resolved):
    """thunder's check of ``node``, under the executors ``resolved`` where it was given any."""
    import thunder.common as common

    if not resolved:
        return check(symbol, node, thunder_options)
    real = common.CompileData
    # the check imports ``CompileData`` from ``thunder.common`` at each call: for its call,
    # that name makes one with the compiler's executors
    common.CompileData = functools.partial(real, executors_list=resolved)
    try:
        return check(symbol, node, thunder_options)
    finally:
        common.CompileData = real


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
            resolved = tuple(resolve_executors(executors)) if executors else None
            key = _check_key(symbol, node, tuple(e.name for e in resolved) if resolved else None, thunder_options)
            if key is not None and key in _passed:
                return True, None
            result = _checked(check, symbol, node, thunder_options, resolved)
            if key is not None and result[0] and len(_passed) < _MAX_PASSED:
                _passed[key] = symbol
            return result

        return check_with_executors

    return wrap_once(dynamo_utils, "try_execute_thunder_symbol", wrap)
