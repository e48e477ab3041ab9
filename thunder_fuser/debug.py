"""``THUNDER_FUSER_DUMP=region,segments,layout,kernels`` prints each stage as it runs
(like nvFuser's ``NVFUSER_DUMP``), with no code change. ``all`` prints every stage."""

from __future__ import annotations

import os
import sys


def enabled(stage: str) -> bool:
    spec = os.environ.get("THUNDER_FUSER_DUMP", "")
    parts = {p.strip() for p in spec.split(",") if p.strip()}
    return stage in parts or "all" in parts


def dump(stage: str, text) -> None:
    if enabled(stage):
        body = text() if callable(text) else text
        print(f"[thunder_fuser:{stage}]\n{body}", file=sys.stderr)
