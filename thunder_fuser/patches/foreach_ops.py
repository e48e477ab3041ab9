"""torch's multi-tensor ``_foreach_*`` ops, traced as one op per tensor.

torch's optimizers update their tensors with ``torch._foreach_*`` ops by default on a GPU
(``foreach=True``: Adam, AdamW and SGD call ``_foreach_mul_``, ``_foreach_lerp_``,
``_foreach_addcdiv_``, ...). thunder 0.2.6 has no mapping for any of them:
- ``thunder.jit`` cannot trace them;
- ThunderFX hands every one to Inductor (the split reason: "expected Tensor as element 0 ...
  but got TensorProxy"), so an optimizer's step never reached an executor of thunder's.

Here each is traced as its per-tensor op, element by element of its lists: thunder's own
symbols called on the proxies (the interpreter does not run the loop: interpreted, a foreach
AdamW over 43 tensors took 44 s to trace, 13 s so), so thunder's in-place handling and our regions see
ordinary ops (``x.mul_(y)``, ``torch.sqrt(x)``). The regions then fuse a whole update per
tensor, and the segments of many tensors can share a launch.

Arguments follow torch's overloads:
- a list is taken element by element; a number or a tensor is shared by every element;
- a tensor of scalars (``addcdiv``'s and ``addcmul``'s ``scalars``) is taken one scalar per
  element;
- ``_foreach_pow(number, tensors)`` raises the number to each tensor.
"""

from __future__ import annotations

import torch

# the per-tensor op of each foreach op (its in-place form is the name with "_" on both)
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "clamp_min", "clamp_max")
_TERNARY = ("addcmul", "addcdiv", "lerp")
_UNARY = ("sqrt", "neg", "reciprocal", "exp", "log", "abs", "sign", "sigmoid", "tanh", "rsqrt", "sin", "cos")
_SCALARS_PER_ELEMENT = {"addcmul": "value", "addcdiv": "value"}  # their tensor of scalars, one per element


_TENSORS: tuple = (torch.Tensor,)  # and thunder's TensorProxy, added at registration


def _is_tensor(x) -> bool:
    """A tensor, or the proxy of one (the loop runs on proxies)."""
    return isinstance(x, _TENSORS)


def _element(x, i: int, per_element: bool = False):
    if isinstance(x, (list, tuple)):
        return x[i]
    if per_element and _is_tensor(x) and x.ndim == 1:
        return x[i]
    return x


def _per_tensor(op: str, in_place: bool, ops):
    """The foreach op as a loop over its lists: ``ops(name)`` gives a per-tensor op (thunder's
    symbols, run on proxies by thunder's jit and by ThunderFX's splitter alike)."""
    scalars = _SCALARS_PER_ELEMENT.get(op)
    arity = 3 if op in _TERNARY else 2 if op in _BINARY else 1

    def run(*args, **kwargs):
        if len(args) > arity:  # torch's scalars passed positionally: name them
            kwargs = {**kwargs, scalars: args[arity]}
            args = args[:arity]
        first = next(a for a in args if isinstance(a, (list, tuple)))
        out = []
        for i in range(len(first)):
            xs = [_element(a, i) for a in args]
            kw = {k: _element(v, i, k == scalars) for k, v in kwargs.items()}
            if scalars and _is_tensor(kw.get(scalars)):
                # a scalar as a tensor, which the per-tensor op takes only as a number:
                # a + value * (b / c), as thunder's addcdiv and torch's CUDA kernel compute
                # it (torch's CPU kernel: (value * b) / c, within fp32 rounding; b * c for addcmul)
                value = kw.pop(scalars)
                inner = ops("div" if op == "addcdiv" else "mul")(xs[1], xs[2])
                op_, xs = "add", [xs[0], ops("mul")(value, inner)]
            else:
                op_ = op
            out.append(ops(op_ + "_")(*xs, **kw) if in_place else ops(op_)(*xs, **kw))
        return None if in_place else out

    run.__name__ = f"_foreach_{op}{'_' if in_place else ''}"
    return run


def _thunder_op(name: str):
    import thunder.torch as ltorch

    return getattr(ltorch, name)


_MAPPED: list = []  # the ops mapped so far (a second import maps nothing again)


def register_foreach_ops() -> list:
    """Map every ``torch._foreach_*`` op torch has of the families above; the ones mapped,
    by this call or an earlier one."""
    from thunder.core import jit_ext
    from thunder.core.proxies import TensorProxy
    from thunder.torch import _torch_to_thunder_function_map

    global _TENSORS
    _TENSORS = (torch.Tensor, TensorProxy)
    for op in _BINARY + _TERNARY + _UNARY:
        for in_place in (False, True):
            torch_fn = getattr(torch, f"_foreach_{op}{'_' if in_place else ''}", None)
            if torch_fn is None or torch_fn in jit_ext._general_jit_lookaside_map:
                continue
            on_proxies = _per_tensor(op, in_place, _thunder_op)
            jit_ext._general_jit_lookaside_map[torch_fn] = jit_ext.ensure_recursive_proxies(
                jit_ext.interpreter_needs_wrap(on_proxies))
            _torch_to_thunder_function_map[torch_fn] = on_proxies
            _MAPPED.append(torch_fn.__name__)
    return list(_MAPPED)
