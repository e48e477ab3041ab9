"""What a long first call is doing: a status line while kernels compile.

A model's first step compiles its kernels (0.2-0.8 s each, 20-40 of them on a litgpt step:
15 s of a 30 s first call on the H100) one region at a time. A user waiting that long must
see why: while a kernel compiles and stderr is a terminal, one line on it is rewritten in
place, ``thunder_fuser: compiling kernels: 12 compiled (8.1 s), 3 from the disk cache``
(and ``, 30 queued for worker processes`` where workers compile them,
``compile_workers.py``; their kernels then count as loaded from the disk cache).
``THUNDER_FUSER_PROGRESS=1`` prints such a line per compiled kernel wherever stderr goes
(a log); ``=0`` prints nothing.
"""

from __future__ import annotations

import sys
from thunder_fuser import config


def _mode() -> str:
    v = config.choice("THUNDER_FUSER_PROGRESS")
    if v == "auto":
        return "line" if sys.stderr.isatty() else "off"
    return {"0": "off", "1": "log"}.get(v, "off")


def report(stats: dict, what: str = "") -> None:
    """After a kernel compiled (``cache.stats``): the status line, if one is wanted."""
    mode = _mode()
    if mode == "off":
        return
    text = (f"thunder_fuser: compiling kernels: {stats['compiled']} compiled ({stats['compile_s']:.1f} s), "
            f"{stats['loaded']} from the disk cache")
    if stats.get("queued"):
        text += f", {stats['queued']} queued for worker processes"
    if mode == "log":
        sys.stderr.write(text + (f" (last: {what})" if what else "") + "\n")
    else:
        sys.stderr.write("\r" + text)
    sys.stderr.flush()
