"""How every patch goes on: once, over thunder's own function, marked so that importing us
again (or a second ``apply_patches``) wraps nothing twice; and how a symbol we define for a
torch function reaches thunder's jit (``traced_as``)."""

from __future__ import annotations

from collections.abc import Callable

_PATCHED = "_thunder_fuser_patch"


def wrap_once(owner, name: str, wrap: Callable[[Callable], Callable]) -> bool:
    """``owner.name = wrap(owner.name)`` unless done already; False where ``owner`` has no
    such attribute (thunder not as expected: it is left as it is)."""
    old = getattr(owner, name, None)
    if old is None:
        return False
    if not getattr(old, _PATCHED, False):
        new = wrap(old)
        setattr(new, _PATCHED, True)
        setattr(owner, name, new)
    return True


def on_each_jitted(marker: str, install: Callable) -> bool:
    """Wrap ``thunder.jit`` so that ``install(jitted)`` runs on each function it makes; once
    per ``marker`` (several such patches wrap it in turn, each under its own mark, where
    ``wrap_once``'s one mark would let only the first on), on thunder 0.2.6 only."""
    import functools

    import thunder

    if thunder.__version__ != "0.2.6":
        return False
    if getattr(thunder.jit, marker, False):
        return True
    jit = thunder.jit

    @functools.wraps(jit)
    def jit_and_install(*args, **kwargs):
        jitted = jit(*args, **kwargs)
        install(jitted)
        return jitted

    setattr(jit_and_install, marker, True)
    thunder.jit = jit_and_install
    return True


def traced_as(torchfn, thunderfn) -> None:
    """thunder's jit copied the torch-to-thunder map into its lookaside table at import: an
    entry added later goes there too, so ``torchfn`` called as a function traces."""
    from thunder.core import jit_ext

    wrap = jit_ext.ensure_recursive_proxies(jit_ext.interpreter_needs_wrap(jit_ext.record_source_loc_in_symbol_header(thunderfn)))
    jit_ext._general_jit_lookaside_map[torchfn] = wrap
