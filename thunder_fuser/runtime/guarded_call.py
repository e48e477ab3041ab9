"""A ``thunder.jit`` function's computation called straight, past thunder's per-call lookup.

Each call of a jitted function looks up its cache before anything runs: the cache info
(default dtype and device, autocast), the alias key over every tensor argument's storage,
then the prologue, which unpacks every list and checks every tensor's metadata. An
optimizer step's update passes every parameter, gradient and moment: for GPT-2's 148
parameters (592 tensors) that lookup took about half of the update call's 0.99 ms on the
H200's host (``scripts/optimizer_step_host.py --cprofile``), in a step whose GPU work
takes 0.53 ms.

``GuardedCall(jitted)`` calls ``jitted`` as thunder would and, after a call that went
through thunder, records the cache entry thunder picked and where each input of its
computation came from among the arguments. A later call of the same shape (the lists'
lengths, the same constants, the same global state that thunder's cache info reads) calls
that computation directly, but only while a guard holds under which thunder's own lookup
would pick the same entry: every tensor of the same type, dtype, device, ``requires_grad``,
sizes and strides as recorded (torch's ``TensorGuards``, one C++ call over all of them),
and no two plain tensors sharing storage, as none did when recorded (thunder's alias key
was then ``""``). Anything else (a new shape, shared storage, an argument that is neither
a tensor, a list of tensors nor a hashable constant, autocast, a function under data
parallel, a computation with a backward or a thunder other than 0.2.6) takes thunder's
call, which is always right. Each shape of the arguments keeps its ``KEPT`` latest recorded calls (tensors of other sizes in turns). The recorded call
skips thunder's call statistics (``cache_hits``, ``calls``); ``last_traces`` stay those of
the entry it runs.
"""

from __future__ import annotations

import torch

from thunder_fuser.patches.alias_keys import storages_distinct

try:  # torch's C++ guard of tensor metadata (dynamo's)
    from torch._C._dynamo.guards import TensorGuards
except ImportError:  # pragma: no cover - a torch without dynamo's guards
    TensorGuards = None

_CONSTANTS = (int, float, bool, str, type(None), torch.dtype, torch.device)


class _PythonGuards:
    """``TensorGuards``' check in Python: type, dtype, device, requires_grad, sizes, strides."""

    def __init__(self, tensors):
        self.metas = [_meta(t) for t in tensors]

    def check(self, *tensors) -> bool:
        try:
            return list(map(_meta, tensors)) == self.metas
        except AttributeError:  # something other than a tensor, as TensorGuards answers
            return False


def _meta(t):
    return type(t), t.dtype, t.device, t.requires_grad, t.shape, t.stride()


def _guards(tensors: list):
    if TensorGuards is None:
        return _PythonGuards(tensors)
    return TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                        dynamic_dims_strides=[list(t.stride()) for t in tensors])


class _Recorded:
    """One recorded call: the computation, the guard, and each computation input's source
    (an index into the flat tensors, or a constant)."""

    def __init__(self, entry, flat: list, sources: list, epi_sources: list):
        self.computation, self.epilogue = entry.computation_fn, entry.epilogue_fn
        self.guards = _guards(flat)
        # the plain tensors, whose storages thunder's alias key compares (``storages_distinct``):
        # where the guard holds, the same places hold tensors of the same types and layouts
        self.plain = [i for i, t in enumerate(flat) if type(t) is torch.Tensor]
        self.sources, self.epi_sources = sources, epi_sources

    def holds(self, flat: list) -> bool:
        if not self.guards.check(*flat):
            return False
        storages = {flat[i].untyped_storage().data_ptr() for i in self.plain}
        return len(storages) == len(self.plain)

    def __call__(self, flat: list):
        inps = [flat[s] if type(s) is int else s.value for s in self.sources]
        result = self.computation(*inps)
        return self.epilogue(*[flat[s] if type(s) is int else s.value for s in self.epi_sources], *result)


def _tensors(args) -> list:
    """The tensors of ``args`` (tensors and lists of them), in order."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif type(a) is list or type(a) is tuple:
            out += a
    return out


class _Constant:
    def __init__(self, value):
        self.value = value


class GuardedCall:
    """``jitted`` (a ``thunder.jit`` function, or any callable: then called as it is), its
    recorded computation called straight where the guard holds (module docstring)."""

    KEPT = 4  # recorded calls per shape of the arguments, the latest first

    def __init__(self, jitted):
        import thunder

        self.jitted = jitted
        self.cd = getattr(jitted, "_lc_cd", None)
        fn = getattr(self.cd, "fn", None)
        # data parallel's cache info reads whether gradients sync this call: its lookup decides
        self.enabled = (thunder.__version__ == "0.2.6" and getattr(self.cd, "get_computation_and_inputs", None) is not None
                        and not getattr(fn, "use_ddp", False) and not getattr(fn, "use_fsdp", False)
                        and self.cd.cache_option in (thunder.CACHE_OPTIONS.CONSTANT_VALUES, thunder.CACHE_OPTIONS.SYMBOLIC_VALUES))
        self.recorded: dict = {}
        self.direct_calls = 0  # calls that skipped thunder's lookup

    def __call__(self, *args, **kwargs):
        shape = self._shape(args, kwargs) if self.enabled else None
        if shape is None:
            return self.jitted(*args, **kwargs)
        flat = _tensors(args)
        for rec in self.recorded.get(shape, ()):
            if rec.holds(flat):
                self.direct_calls += 1
                return rec(flat)
        out = self.jitted(*args, **kwargs)
        self._record(shape, flat, args, kwargs)
        return out

    def _shape(self, args, kwargs):
        """What thunder's lookup reads besides the tensors: the arguments' structure (a
        tensor, a list's length, a constant's value), the keyword constants, the global
        state of its cache info; None where an argument is something else."""
        parts = []
        for a in args:
            if isinstance(a, torch.Tensor):
                parts.append("T")
            elif type(a) is list or type(a) is tuple:  # of tensors: the guard checks each (a record, that all are)
                parts.append((type(a), len(a)))
            elif type(a) in _CONSTANTS:
                parts.append((type(a), a))
            else:
                return None
        if not all(type(v) in _CONSTANTS for v in kwargs.values()):
            return None
        if torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled():
            return None  # thunder's cache info then holds autocast's dtypes too: its lookup decides
        return (tuple(parts), tuple(sorted((k, type(v), v) for k, v in kwargs.items())), torch.get_default_dtype(),
                str(torch.get_default_device()), torch.is_grad_enabled())

    def _record(self, shape, flat: list, args, kwargs) -> None:
        """After thunder's call: the entry thunder's lookup picks for these arguments (looked
        up once more: the prologue only unpacks and checks), where each input of its
        computation and epilogue comes from."""
        if not all(isinstance(t, torch.Tensor) and t.layout is torch.strided for t in flat):
            return  # a list holding something else, a sparse tensor: every such call is thunder's
        if not storages_distinct(flat):
            return  # thunder's alias key was not "": its entry is for that sharing
        if torch.is_grad_enabled() and any(t.requires_grad for t in flat):
            return  # its entry has a backward (checked below too): no second lookup each call
        entry, inps, pro_to_epi = self.cd.get_computation_and_inputs(*args, **kwargs)
        if entry.backward_fn is not None:
            return
        index = {id(t): i for i, t in enumerate(flat)}

        def sources(values):
            out = []
            for v in values:
                if isinstance(v, torch.Tensor):
                    if id(v) not in index:
                        return None  # made by the prologue: not one of the arguments
                    out.append(index[id(v)])
                elif type(v) in _CONSTANTS:
                    out.append(_Constant(v))
                else:
                    return None
            return out

        src, epi = sources(inps), sources(pro_to_epi)
        if src is not None and epi is not None:
            kept = self.recorded.setdefault(shape, [])
            kept.insert(0, _Recorded(entry, flat, src, epi))
            del kept[self.KEPT:]
