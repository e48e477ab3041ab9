"""thunder's dead-code elimination, linear in a fusion's size again.

``thunder.core.transform_common._remove_noop_subsymbols`` (which ``dce`` runs on every
bound symbol) asks, for each subsymbol of a symbol, whether the *parent* carries the
``DONT_DCE`` tag, and ``has_tags`` gathers the tags of the parent's whole subtree to answer:
the parent's size once per subsymbol, quadratic in it. A fusion's bound symbol holds every
op of its region as a subsymbol: the ``dce`` of the trace our fusion pass builds took 270 of
a 600 s first call (cProfile) for the foreach AdamW step of a tiny 12-layer GPT-2 (148
parameters, one region of about 10,000 ops): 159 million ``gather_tags`` calls. The parent
does not change inside the loop, so the answer is asked once per parent: the same result.
Installed only on the thunder whose function this was read from (0.2.6).
"""

from __future__ import annotations

def _remove_noop_subsymbols(bsym) -> None:
    from thunder.core import prims
    from thunder.core.symbol import has_tags

    keep_constants = None  # has_tags(bsym, DONT_DCE), asked at most once
    kept = []
    for sbsym in bsym.subsymbols:
        if len(sbsym.subsymbols) == 0 and not sbsym.sym.is_prim:
            continue
        if not any(o is not None for o in sbsym.flat_proxy_outs):
            if keep_constants is None:
                keep_constants = has_tags(bsym, {prims.OpTags.DONT_DCE})
            if not keep_constants:
                continue
        _remove_noop_subsymbols(sbsym)
        kept.append(sbsym)
    bsym.subsymbols = kept


def linear_dce() -> bool:
    """Install it; whether it took (another thunder keeps its own)."""
    import thunder
    from thunder.core import transform_common

    if thunder.__version__ != "0.2.6":
        return False

    if getattr(transform_common._remove_noop_subsymbols, "__module__", "") == __name__:
        return True
    transform_common._remove_noop_subsymbols = _remove_noop_subsymbols
    return True
