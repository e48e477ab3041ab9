"""Run order, launches and buffer lifetimes for a region's segments.

Segments run in creation order (a topological order by construction of the segmenter).
Consecutive pointwise/resize segments that read nothing of each other (RoPE's q and k: the
segmenter keeps different iteration domains apart; an optimizer's update of each parameter,
in place: ``chains.py``) form one step: the plan runs such a
step as one kernel launch when every member compiles to one pointwise kernel, since a
short kernel alone loses much of its time to ramp-up and tail. A value passed between
segments is allocated by its producer and freed right after the last segment that reads
it, unless the region returns it.
"""

from __future__ import annotations

from dataclasses import dataclass

from thunder_fuser.ir.region import Region


@dataclass
class Schedule:
    order: list  # segments
    free_after: dict[int, list]  # segment index -> values whose last reader it is
    steps: list = None  # lists of segments, in order: a list of several may share one launch


_SHARES_LAUNCH = ("pointwise", "resize")
# the most tensors the members of one shared launch read and write: the launch passes them
# all as kernel parameters, and a kernel's code holds every member's program
MAX_SHARED_OPERANDS = 64


def launch_steps(segments: list) -> list[list]:
    """Segments in order, consecutive independent pointwise/resize segments grouped into one
    step: none reads what another makes, none writes memory another reads or writes (their
    blocks run in any order), and together they pass at most ``MAX_SHARED_OPERANDS`` tensors."""
    steps: list[list] = []
    for seg in segments:
        group = steps[-1] if steps else None
        if group and seg.kind in _SHARES_LAUNCH and all(s.kind in _SHARES_LAUNCH for s in group):
            made = {id(o) for s in group for o in s.outputs}
            touched = frozenset().union(*(s.touched_roots for s in group))
            written = frozenset().union(*(s.written_roots for s in group))
            if (not any(id(v) in made for v in seg.inputs) and not seg.written_roots & touched
                    and not seg.touched_roots & written
                    and sum(_operands(s) for s in group) + _operands(seg) <= MAX_SHARED_OPERANDS):
                group.append(seg)
                continue
        steps.append([seg])
    return steps


def _operands(seg) -> int:
    return len(seg.inputs) + len(seg.outputs)


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
    return Schedule(list(segments), free_after, launch_steps(segments))
