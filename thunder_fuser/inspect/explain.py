"""``explain(jfn)``: per region and per segment, what runs where and why neighbours split.
It reads the regions' segments and each plan's ``Decision`` (``plan/decision.py``: kinds,
fallbacks, layouts, launches apart, the notes each kernel gave when it was prepared), data
only, never a kernel."""

from __future__ import annotations

from thunder_fuser.inspect.printing import segment_lines


def _fusions(trace):
    from thunder_fuser.runtime.region_runner import RegionRunner

    for bsym in trace.bound_symbols:
        ctx = bsym._call_ctx or {}
        runner = ctx.get(bsym.sym.name)
        if isinstance(runner, RegionRunner):
            yield runner


def explain(jfn) -> str:
    """A report on every fuser region of ``jfn``'s last execution traces (forward, and
    backward when there is one)."""
    import thunder

    traces = [thunder.last_traces(jfn)[-1]]
    try:
        bw = thunder.last_backward_traces(jfn)
        if bw:
            traces.append(bw[-1])
    except Exception:
        pass
    lines = []
    for trace in traces:
        for runner in _fusions(trace):
            region = runner.region
            lines.append(
                f"region {region.name}: {len(region.nodes)} ops in {len(runner.segments)} segment(s), "
                f"inputs ({', '.join(v.name for v in region.inputs)}) -> outputs ({', '.join(v.name for v in region.outputs)})"
            )
            for note in region.notes:
                lines.append(f"  in-place: {note}")
            live = {id(s) for s in runner.segments}
            for seg in runner.segments:
                if not seg.split_reason:
                    continue
                if seg.split_from is None:
                    lines.append(f"  segment {seg.index} opened: {seg.split_text()}")
                elif id(seg.split_from) in live:
                    lines.append(f"  segment {seg.index} split from segment {seg.split_from.index}: {seg.split_text()}")
                else:  # it launched nothing and was dropped
                    lines.append(f"  segment {seg.index} split from a segment since dropped: {seg.split_text()}")
            for key, decision in ((key, plan.decision) for key, plan in runner.plans.items()):
                changed = {i: k for i, k in decision.kinds.items() if k != runner.segments[i].kind}
                if changed:
                    lines.append(f"  for input strides {key}: " + ", ".join(
                        f"segment {i} runs as {k}" + (f" ({decision.fallbacks[i]})" if i in decision.fallbacks else "")
                        for i, k in changed.items()
                    ))
                for note in decision.layout_notes:
                    lines.append(f"  for input strides {key}: {note}")
                for i, notes in sorted(decision.kernel_notes.items()):
                    for note in notes:
                        lines.append(f"  for input strides {key}: segment {i} {note}")
                for first, why in decision.apart.items():
                    lines.append(f"  for input strides {key}: the segments sharing a launch with segment {first} launch apart: {why}")
            lines.extend("  " + l for l in segment_lines(runner.segments))
    return "\n".join(lines)

