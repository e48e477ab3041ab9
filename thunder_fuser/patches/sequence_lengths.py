"""Every list's, tuple's and dict's length among a call's arguments in thunder's cache key.

thunder 0.2.6's prologue reads a list argument's elements by index (``subscr0[0]``,
``subscr0[1]``) and checks the top-level ``args`` and ``kwargs`` lengths only. A function
that loops over a list (``for x, y in zip(xs, ys): x.add_(y)``, an optimizer's update of
its parameters) traced for 3 elements therefore also passes the prologue for a list of 4,
and the cached trace runs on the first 3: the fourth element's in-place update is silently
lost, its result missing (found by ``tests/test_guarded_call.py``: with thunder's own
executors too). thunder's prologue checks every key of its cache info against the value
it had when the trace was made, so the lengths of the nested sequences, as one string in
the cache info, make a call with another length miss the cache and trace anew, as one with
another shape does. The walk reads one ``len`` per list (a list of leaves is not walked
element by element), installed like ``alias_keys`` on each function ``thunder.jit`` makes,
on thunder 0.2.6 only.
"""

from __future__ import annotations

import functools

from thunder_fuser.patches.wrap import on_each_jitted

_LENGTHS_KEY = "sequence_lengths"
_SEQUENCES = frozenset((list, tuple, dict))


def sequence_lengths(args, kwargs) -> str:
    """The lengths of the lists, tuples and dicts nested in ``args`` and ``kwargs``, in the
    order of a depth-first walk (the top-level ``args`` and ``kwargs`` themselves, which
    thunder checks, are not among them)."""
    out: list[str] = []
    for a in args:
        _walk(a, out)
    for v in kwargs.values():
        _walk(v, out)
    return ",".join(out)


def _walk(obj, out: list) -> None:
    kind = type(obj)
    if kind is list or kind is tuple:
        out.append(str(len(obj)))
        if not _SEQUENCES.isdisjoint(map(type, obj)):  # a list of leaves: no Python step per element
            for x in obj:
                _walk(x, out)
    elif kind is dict:
        out.append(f"d{len(obj)}")
        for x in obj.values():
            _walk(x, out)


def keyed_by_lengths(populate):
    """``populate`` (thunder's ``populate_cache_info``) that also records the lengths."""

    @functools.wraps(populate)
    def populate_cache_info(cache_info, *args, **kwargs):
        out = populate(cache_info, *args, **kwargs)
        cache_info[_LENGTHS_KEY] = sequence_lengths(args, kwargs)
        return out

    populate_cache_info.original = populate
    return populate_cache_info


def _install(jitted) -> bool:
    """Swap ``populate_cache_info`` in the closures under ``jitted``'s cache lookup."""
    import thunder

    cd = thunder.compile_data(jitted)
    lookup = getattr(cd, "get_computation_and_inputs", None)
    if lookup is None:
        return False
    found = False
    seen, todo = set(), [lookup]
    while todo:
        fn = todo.pop()
        if id(fn) in seen or getattr(fn, "__closure__", None) is None:
            continue
        seen.add(id(fn))
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if name == "populate_cache_info" and callable(value):
                if not hasattr(value, "original"):
                    cell.cell_contents = keyed_by_lengths(value)
                found = True
            elif callable(value) and getattr(value, "__code__", None) is not None:
                todo.append(value)
    return found  # ``cd.populate_cache_info`` (read by thunder's tests only) stays thunder's


def key_by_sequence_lengths() -> bool:
    """Wrap ``thunder.jit`` so that each function it makes keys its cache by the lengths."""
    return on_each_jitted("sequence_lengths", _install)
