"""``THUNDER_FUSER_DUMP=region,segments,layout`` prints each stage as it runs (like
nvFuser's ``NVFUSER_DUMP``), with no code change. ``all`` prints every stage; an unknown
stage is an error that lists the valid ones (``config.py``)."""

from __future__ import annotations

import sys

from thunder_fuser import config


def enabled(stage: str) -> bool:
    parts = config.items("THUNDER_FUSER_DUMP")
    return stage in parts or "all" in parts


def dump(stage: str, text) -> None:
    if enabled(stage):
        body = text() if callable(text) else text
        print(f"[thunder_fuser:{stage}]\n{body}", file=sys.stderr)
