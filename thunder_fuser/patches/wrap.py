"""How every patch goes on: once, over thunder's own function, marked so that importing us
again (or a second ``apply_patches``) wraps nothing twice."""

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
