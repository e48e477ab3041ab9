"""Which input dims of a reshape become which output dims, when the reshape only splits
or merges dims. Layout propagates through such reshapes (nvFuser stops at every reshape)."""

from __future__ import annotations


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Pair consecutive runs of ``src`` dims with runs of ``dst`` dims of equal product.

    Size-1 dims form their own empty-mapped groups. Returns None for a reshape that is not
    a clean split/merge (it cannot happen for equal numel, but keeps callers honest).
    """
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        gi, gj = [i], [j]
        ps, pd = src[i], dst[j]
        i += 1
        j += 1
        while ps != pd:
            if ps < pd:
                if i >= len(src):
                    return None
                ps *= src[i]
                gi.append(i)
                i += 1
            else:
                if j >= len(dst):
                    return None
                pd *= dst[j]
                gj.append(j)
                j += 1
        groups.append((gi, gj))
    return groups
