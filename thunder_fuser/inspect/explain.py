"""``explain(jfn)``: per region and per segment, what runs where and why neighbours split."""

from __future__ import annotations

from thunder_fuser.backends.cute.lower.expr import reductions_in_order, softmax_sums
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
            for key, plan in runner.plans.items():
                changed = {i: k for i, k in plan.kinds.items() if k != runner.segments[i].kind}
                if changed:
                    lines.append(f"  for input strides {key}: " + ", ".join(
                        f"segment {i} runs as {k}" + (f" ({plan.fallbacks[i]})" if i in plan.fallbacks else "")
                        for i, k in changed.items()
                    ))
                for note in plan.layout_notes:
                    lines.append(f"  for input strides {key}: {note}")
                for i, k in sorted(plan.kernels.items()):
                    for note in _kernel_notes(k):
                        lines.append(f"  for input strides {key}: segment {i} {note}")
                for first, why in plan.apart.items():
                    lines.append(f"  for input strides {key}: the segments sharing a launch with segment {first} launch apart: {why}")
            lines.extend("  " + l for l in segment_lines(runner.segments))
    return "\n".join(lines)


def _kernel_notes(kernel) -> list[str]:
    """How a segment's kernels depart from the plain templates: reductions split across
    blocks (two launches each: partials, then a combine), operands staged through shared
    memory (a tiled transpose), reductions in two stages."""
    notes = []
    if getattr(kernel, "columns_apart", ""):
        notes.append(f"takes its sums per column in a reduction of their own after its rows ({kernel.columns_apart})")
    for part in getattr(kernel, "parts", ()):
        if part.geo.stage:
            slots = set(part.geo.stage[1])
            names = sorted({ld.source.name for ld in part.prog.loads if part.geo.load_slot[id(ld)] in slots})
            if part.transposed_copy:
                notes.append(f"copies {', '.join(names)} through shared-memory tiles into the order of its reduction's "
                             f"rows (a tiled transpose), then reduces reading the copy in vectors")
            else:
                notes.append(f"reads {', '.join(names)} through shared-memory tiles (a tiled transpose: "
                             f"{'they are' if len(names) > 1 else 'it is'} contiguous along another dim than the output)")
        if part.geo.looped:
            online = softmax_sums(reductions_in_order(part.prog))
            notes.append(f"loops over rows too long for registers ({part.geo.n} elements): a pass per reduction"
                         + (" (the max and the sum of exp(x - max) in one: online softmax)" if online else "")
                         + (", then one for its stores" if any(not st.is_row for st in part.prog.stores) else ""))
        if part.first_stage:
            inner, other = part.first_stage
            notes.append(f"reduces over dims {inner} first, into partials, then over dims {other} reading those "
                         f"(two row kernels: its reduced dims are runs apart in memory)")
        if part.workspace is None:
            continue
        if part.geo.across:
            notes.append(f"takes its sums per column in its row kernel: each of its {part.workspace[0]} blocks adds "
                         f"up the rows it walks into a partial, then a second launch adds the partials")
            continue
        splits, what = part.workspace[0], "column" if part.geo.columns else "row"
        notes.append(f"splits each {what} of its reduction across {splits} blocks, then combines their partials "
                     f"in a second launch")
    return notes
