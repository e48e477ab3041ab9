"""Run order and buffer lifetimes for a region's segments.

Segments run in creation order (a topological order by construction of the segmenter).
A value passed between segments is allocated by its producer and freed right after the
last segment that reads it, unless the region returns it.
"""

from __future__ import annotations

from dataclasses import dataclass

from thunder_fuser.ir.region import Region


@dataclass
class Schedule:
    order: list  # segments
    free_after: dict[int, list]  # segment index -> values whose last reader it is


def schedule_segments(region: Region, segments: list) -> Schedule:
    keep = {id(v) for v in region.outputs} | {id(v) for v in region.inputs}
    last_use: dict[int, int] = {}
    values = {}
    for seg in segments:
        for v in seg.inputs:
            if id(v) not in keep:
                last_use[id(v)] = seg.index
                values[id(v)] = v
    free_after: dict[int, list] = {}
    for vid, idx in last_use.items():
        free_after.setdefault(idx, []).append(values[vid])
    return Schedule(list(segments), free_after)
