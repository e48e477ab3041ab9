"""How a region reads in a trace: its segments, in order, with kind, inputs, outputs, ops.

Traces are our user interface (NVIDIA/Fuser#785: users could not tell which op landed in
which kernel). This text is API: tests compare it with golden strings.
"""

from __future__ import annotations

import torch

from thunder_fuser.ir.region import Node, Value
from thunder_fuser.segment import Segment
from thunder_fuser.segment.schedule import launch_steps


def _fmt(x) -> str:
    if isinstance(x, Value):
        return x.name
    if isinstance(x, torch.dtype):
        return str(x).replace("torch.", "dtypes.")
    if isinstance(x, torch.device):
        return f"devices.Device('{x}')"
    if isinstance(x, tuple):
        inner = ", ".join(_fmt(e) for e in x)
        return f"({inner},)" if len(x) == 1 else f"({inner})"
    if isinstance(x, list):
        return "[" + ", ".join(_fmt(e) for e in x) + "]"
    return repr(x)


def op_line(node: Node) -> str:
    """``t0 = prims.add(a, b)``, from the IR (after functionalize renamed aliases)."""
    outs = ", ".join(o.name for o in node.outputs)
    if len(node.outputs) > 1 or node.op == "update_aliases":
        outs = f"({outs},)" if len(node.outputs) == 1 else f"({outs})"
    args = [_fmt(a) for a in node.args] + [f"{k}={_fmt(v)}" for k, v in node.kwargs.items()]
    prefix = "" if node.op == "copy_to_out_" else "prims."
    return f"{outs} = {prefix}{node.op}({', '.join(args)})"


def _names(values) -> str:
    return ", ".join(v.name for v in values)


def segment_lines(segments: list[Segment], kinds: dict[int, str] | None = None) -> list[str]:
    shared = {}
    for step in launch_steps(segments):
        if len(step) > 1:
            for seg in step:
                others = [str(s.index) for s in step if s is not seg]
                shared[seg.index] = f"  one launch with segment{'s' if len(others) > 1 else ''} {', '.join(others)}"
    lines = []
    for seg in segments:
        desc = seg.describe()
        if kinds and kinds.get(seg.index, seg.kind) != seg.kind:
            desc = kinds[seg.index]
        lines.append(f"segment {seg.index} [{desc}]  ({_names(seg.inputs)}) -> ({_names(seg.outputs)}){shared.get(seg.index, '')}")
        lines.extend(f"  {op_line(n)}" for n in seg.nodes)
    return lines
