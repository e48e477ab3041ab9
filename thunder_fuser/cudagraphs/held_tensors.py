"""The tensors a ``thunder.jit`` step reads that are not its arguments: what a graph of the
step must be keyed on besides them.

A CUDA graph replays its kernels over the addresses it captured. The tensors passed to a step
are seen by ``graphs.GraphedStep`` directly; a module's parameters and buffers, and tensors
that an argument or the module holds (a transformers ``StaticCache`` the module keeps, and
swaps for a new one between generations), are not: thunder's prologue fetches them on every
call (``module.cache.key_cache[0]``, ``module.get_parameter(...)``). A graph captured over an
old cache would replay over it while thunder's own step writes the new one.

``HeldTensors.of(step, ...)`` reads the prologue of the step's last call:

* a parameter or buffer comes from the dictionaries thunder's module keeps from ``thunder.jit``
  on (``set_buffer`` changes them, as do thunder's transforms that replace a parameter; a
  module that swaps in a new buffer itself is not seen by thunder either: ``test_decode.py``'s
  xfail). Each call looks these names up in those dictionaries again, a dictionary lookup
  apiece;
* every other fetch (an attribute of the module or of an argument, an item of a list it
  holds) is run again each call, with the prologue's checks left out: a slice of the trace
  back from what it returns.

``signature(args, kwargs)`` is what a graph captured now depends on: the tensors held (not
the arguments' own, which the graph keys or buffers itself) with their addresses, and every
number fetched. A litgpt decode step looks up 41 tensors and fetches one attribute again; a
transformers step with its ``StaticCache`` fetches its 8 cache tensors again (8-11 us a
call on the CPU machine).
"""

from __future__ import annotations

import weakref

import torch

_data_ptr = torch.Tensor.data_ptr
_KEPT = ("unpack_parameter", "unpack_buffer")  # looked up in the dictionaries of thunder's module


def _thunder_parts(step):
    """(compile data, compile stats) of a ``thunder.jit`` function or module; None otherwise."""
    cd, cs = getattr(step, "_lc_cd", None), getattr(step, "_lc_cs", None)
    if cd is None or cs is None or getattr(cs, "last_prologue_traces", None) is None:
        return None
    return cd, cs


def _fetching(prologue, wanted: list):
    """A function of the step's arguments returning the ``wanted`` proxies' values: the
    prologue's bound symbols they need (its unpacks, none of its checks)."""
    from thunder.core import prims
    from thunder.core.trace import from_trace, tracectx

    need = {p.name for p in wanted}
    kept = []
    for bsym in reversed(prologue.bound_symbols[:-1]):
        if any(p.name in need for p in bsym.flat_proxy_outs):
            kept.append(bsym)
            need.update(p.name for p in bsym.flat_proxy_args)
    trace = from_trace(prologue)
    trace.bound_symbols = kept[::-1]
    with tracectx(trace):
        prims.python_return(tuple(wanted))
    return trace.python_callable(include_decorators=False)


class HeldTensors:
    """What a thunder step's last call read besides its arguments' tensors (module docstring)."""

    def __init__(self, step, prologue, cd, cs, args, kwargs, arg_tensors):
        self._cd, self._cs = cd, cs
        returned = prologue.bound_symbols[-1].args[0][0]  # the computation's inputs
        made_by = {o.name: b for b in prologue.bound_symbols for o in b.flat_proxy_outs}
        values = self._call(_fetching(prologue, list(returned)), args, kwargs)
        passed = {id(t) for t in arg_tensors}
        looked_up: dict[int, tuple] = {}  # id of thunder's dictionary -> (it, the names)
        again = []
        for proxy, value in zip(returned, values):
            if id(value) in passed:  # the graph keys or buffers the arguments' tensors itself
                continue
            table = self._table(step, made_by, proxy, value)
            if table is None:
                again.append(proxy)
            else:
                looked_up.setdefault(id(table[0]), (table[0], []))[1].append(table[1])
        self.looked_up = [(d, tuple(names)) for d, names in looked_up.values()]
        self._fetch = _fetching(prologue, again) if again else None

    @staticmethod
    def _table(step, made_by, proxy, value):
        """(thunder's dictionary, name) that a parameter or buffer of the step's module came
        from, or None: fetched otherwise, or not where a lookup finds it now."""
        bsym = made_by.get(getattr(proxy, "name", None))
        if bsym is None or bsym.sym.name not in _KEPT or not isinstance(value, torch.Tensor):
            return None
        owner = made_by.get(getattr(bsym.args[0], "name", None))
        table = getattr(step, "_overrides_parameters" if bsym.sym.name == "unpack_parameter" else "_overrides_buffers",
                        None)
        name = bsym.args[1]
        if owner is None or owner.sym.name != "unpack_thunder_module" or table is None or table.get(name) is not value:
            return None
        return table, name

    @classmethod
    def of(cls, step, args, kwargs, arg_tensors) -> "HeldTensors | None":
        """From the prologue of ``step``'s last call; None where ``step`` is not thunder's."""
        parts = _thunder_parts(step)
        if parts is None:
            return None
        cd, cs = parts
        return cls(step, cs.last_prologue_traces[-1], cd, cs, args, kwargs, arg_tensors)

    def _call(self, fetch, args, kwargs) -> tuple:
        from thunder.core.compile_data import compile_data_and_stats

        with compile_data_and_stats(self._cd, self._cs):  # the prologue finds thunder's module there
            return fetch(*args, **kwargs)

    def signature(self, args, kwargs) -> "Signature":
        """Raises KeyError where a name looked up is gone (thunder's trace is another now)."""
        tensors = [d[n] for d, names in self.looked_up for n in names]
        values = ()
        if self._fetch is not None:
            fetched = self._call(self._fetch, args, kwargs)
            tensors += [x for x in fetched if isinstance(x, torch.Tensor)]
            values = tuple(x for x in fetched if not isinstance(x, torch.Tensor))
        return Signature(tensors, values)


class Signature:
    """The held tensors and numbers of one call. Their addresses and the numbers are part of
    a graph's key (``graphs.GraphedStep``); ``same_tensors`` checks what the key cannot: the
    same tensor objects, else the same shapes, strides and dtypes at those addresses."""

    __slots__ = ("tensors", "values", "ptrs")

    def __init__(self, tensors: list, values: tuple):
        self.tensors, self.values = tensors, values
        self.ptrs = tuple(map(_data_ptr, tensors))

    def frozen(self) -> "FrozenSignature":
        return FrozenSignature(self)

    def same_tensors(self, frozen: "FrozenSignature") -> bool:
        """For a signature whose addresses and numbers are ``frozen``'s (the same key)."""
        if all(r() is t for r, t in zip(frozen.refs, self.tensors)):
            return True
        return _metadata(self.tensors) == frozen.metadata


def _metadata(tensors) -> tuple:
    return tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in tensors)


class FrozenSignature:
    """A capture's held tensors: weak references to them (a graph keeps no old cache alive)
    and their metadata."""

    __slots__ = ("refs", "metadata")

    def __init__(self, sig: Signature):
        self.refs = tuple(weakref.ref(t) for t in sig.tensors)
        self.metadata = _metadata(sig.tensors)
