"""Group a region's nodes into kernel segments.

Greedy, in one pass over the nodes in program order (linear time: 5,000 ops segment in
milliseconds, where nvFuser's segmenter needed 300 s for 30 Linear+ReLU layers,
NVIDIA/Fuser#3510). A node joins the segment of its latest producer when

* one kernel template can still run the segment (:func:`_try_join` states the rule and,
  when it fails, the reason a user reads in ``explain``),
* no in-place write is reordered around a read of the same memory (``hazards.py``).

Joining only the *latest* producer's segment keeps creation order a topological order, so
the segment graph is acyclic by construction. A node with no producer segment (it reads
only region inputs) may join the newest segment horizontally when both are the same kind
over the same domain; otherwise it opens a segment, and the reason is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder_fuser.ir.ops import METADATA, kind_of, reduction_dims
from thunder_fuser.ir.region import Node, Region, Value
from thunder_fuser.segment.chains import independent_chains
from thunder_fuser.segment.domains import iteration_domains
from thunder_fuser.segment.hazards import WriteHazards
from thunder_fuser.segment.recompute import cheap, reading_clones, recompute_reduction_inputs


@dataclass(eq=False)
class Segment:
    index: int
    kind: str  # pointwise | reduction | normalization | resize | transpose | view | alias | reference
    domain: tuple[int, ...]
    nodes: list[Node] = field(default_factory=list)
    reduced: tuple[int, ...] | None = None
    # the complementary dims of sums taken per column beside the rows (a norm backward's
    # weight gradient beside its input gradient): ``_joins_per_column``
    across: tuple[int, ...] | None = None
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    reduced_values: set = field(default_factory=set)
    column_values: set = field(default_factory=set)  # ids of the per-column sums and what only they make
    # why this segment did not join the segment ``split_from`` (the first it was tried
    # against): ``SEG`` in the text stands for that segment, described as it ends up
    split_reason: str | None = None
    split_from: Segment | None = None
    reads: set = field(default_factory=set)  # ids of every value its nodes read
    # ids of outputs that are views but are stored by the kernel all the same (a plan's
    # choice: ``plan/stored_views.py``)
    stored_views: frozenset = frozenset()
    # ids of the storage roots its nodes read or write, and of those it writes: may it share
    # a launch with another segment (``schedule.launch_steps``)?
    touched_roots: frozenset = frozenset()
    written_roots: frozenset = frozenset()

    def split_text(self) -> str | None:
        """``split_reason`` with ``split_from`` described as it is now: a segment keeps
        growing after the reason was found, and may become a view segment."""
        if self.split_reason is None or self.split_from is None:
            return self.split_reason
        return self.split_reason.replace(SEG, _what(self.split_from))

    def describe(self) -> str:
        if self.kind in ("reduction", "normalization") and self.reduced is not None:
            op = next((n.op for n in self.nodes if _row_reduction(self, n)), "reduction")
            per_column = f", sum over dims {self.across} per column" if self.across else ""
            return f"{self.kind}: {op} over dims {self.reduced}{per_column}"
        return self.kind


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _reduced_shape(domain, dims) -> tuple[int, ...]:
    return tuple(s for i, s in enumerate(domain) if i not in dims)


def _keepdim_shape(domain, dims) -> tuple[int, ...]:
    return tuple(1 if i in dims else s for i, s in enumerate(domain))


def _row_reduction(seg: Segment, node: Node) -> bool:
    return seg_kind(node) == "reduction" and not (seg.across and reduction_dims(node) == seg.across)


SEG = "\x00segment\x00"  # the segment a split reason is about (``Segment.split_text``)


def _what(seg: Segment) -> str:
    if seg.kind in ("reduction", "normalization"):
        op = next(n.op for n in seg.nodes if _row_reduction(seg, n))
        return f"{op} over {seg.reduced}"
    if seg.kind in ("alias", "reference"):
        return f"the {seg.kind} segment"
    return f"the {seg.kind} ops over {seg.domain}"


def _node_what(node: Node, dom) -> str:
    if seg_kind(node) == "reduction":
        return f"{node.op} over {reduction_dims(node)}"
    return f"{node.op} over {dom}"


# view ops that any strides express (never a copy): one over region inputs joins a
# reduction over its domain for free. A thunder trace reorders freely (rematerialization
# sorts the nodes it moves), so the broadcast of a saved statistic can come right after
# the row sum it feeds; opening a segment for it would split a layernorm backward in two.
_STRIDED_VIEWS = ("broadcast_in_dim", "shallow_copy", "transpose", "squeeze")


# the reductions a row kernel also takes per column: each thread adds up its own columns
# over the rows it walks (sum only: a weight or bias gradient)
PER_COLUMN_OPS = ("sum",)


def _joins_per_column(seg: Segment, node: Node, k: str, dom: tuple[int, ...]) -> bool:
    """Does ``node`` join ``seg`` as a sum per column, or as an op over those sums only?

    A norm backward reduces over each row (the input gradient) and over the rows (the
    weight gradient, ``sum(grad * x_hat, 0)``) from the same operands. Two kernels read
    them twice; Inductor's one kernel reads them once, its threads keeping partial column
    sums of the rows they walk. A sum over exactly the dims the row reduction keeps, over
    the same domain, joins when its argument uses none of the row reductions (the row
    kernel has every column of a row at once, but a row's statistics only after it), and so
    do ops over such sums alone, per column (a cast of the gradient). The segment's rows
    must end at the last dim, as a layer's rows do in the default layout (a column sum
    met first keeps a segment of its own: its rows would join it as sums per column).
    Which dims are along memory is up to the layout: the kernel takes the sums per column
    only where the rows are innermost (``kernels.expr.columns_apart`` splits them
    otherwise)."""
    if seg.kind not in ("reduction", "normalization") or not seg.reduced or len(seg.domain) - 1 not in seg.reduced:
        return False
    if k == "reduction":
        rd = reduction_dims(node)
        return (node.op in PER_COLUMN_OPS and seg.domain == dom and seg.across in (None, rd)
                and set(rd) | set(seg.reduced) == set(range(len(dom))) and not set(rd) & set(seg.reduced)
                and not any(id(v) in seg.reduced_values for v in node.inputs()))
    tensors = [v for v in node.inputs() if v.is_tensor]
    return (bool(seg.across) and k in ("pointwise", "view") and bool(tensors)
            and dom in (_reduced_shape(seg.domain, seg.across), _keepdim_shape(seg.domain, seg.across))
            and all(id(v) in seg.column_values for v in tensors))


def _try_join(seg: Segment, node: Node, k: str, dom: tuple[int, ...], dependent: bool) -> str | None:
    """None when ``node`` (of family ``k``) can join ``seg`` under one kernel template, else
    the reason. ``dependent``: ``seg`` produces one of ``node``'s inputs."""
    if seg.kind in ("alias", "reference"):
        return f"{SEG} is a memory barrier"
    if node.op == "reshape" and (laid := _laid_out_in(seg, node)) is not None:
        # x.contiguous().reshape(...): the program made x dense so the reshape is a view; a
        # kernel reading through both would need that copy at the operand's strides
        return f"reshape reads {laid}, which stride_order lays out first"
    if _joins_per_column(seg, node, k, dom):
        return None
    if any(id(v) in seg.column_values for v in node.inputs()):
        return f"{node.op} reads the sums per column of {SEG} with other values"
    if not dependent:
        # horizontal fusion: same kind, same iteration space
        if k == "reduction":
            if seg.kind == "reduction" and seg.domain == dom and seg.reduced == reduction_dims(node):
                return None
        elif k == "resize":
            # slices of region inputs are just indexing inside a resize kernel, which also
            # runs pointwise work (RoPE: q * cos beside the rotated q)
            if seg.kind in ("resize", "pointwise"):
                return None
        elif k in ("pointwise", "view", "write"):
            if seg.kind == "pointwise" and (seg.domain == dom or _numel(dom) == _numel(seg.domain)):
                return None
            if seg.kind == "resize" and _numel(dom) == _numel(seg.domain):
                return None  # the residual read of x + rotate_half(x) in bf16
            if seg.kind in ("reduction", "normalization"):
                # per reduced row: the epilogue of a reduction kernel computes it
                if dom in (_keepdim_shape(seg.domain, seg.reduced), _reduced_shape(seg.domain, seg.reduced)):
                    return None
                # full domain: worth it only where it saves a read of a shared input;
                # otherwise a pointwise kernel reads as much and schedules better
                if dom == seg.domain:
                    if seg.kind == "normalization" or any(id(v) in seg.reads for v in node.tensor_inputs()):
                        return None
                    if node.op in _STRIDED_VIEWS or not node.tensor_inputs():
                        # no read of its own (a view: its consumers load through it; an iota
                        # or a full: computed in the kernel from each element's index)
                        return None
                    return f"{SEG} and {_node_what(node, dom)} share no input"
        return f"{SEG} and {_node_what(node, dom)} have different iteration domains"
    if k == "reduction":
        rd = reduction_dims(node)
        if seg.kind == "pointwise" and seg.domain == dom:
            return None
        if seg.kind in ("reduction", "normalization") and seg.domain == dom and seg.reduced == rd:
            return None
        if seg.kind == "resize":
            return f"no kernel template fuses resize ops with {node.op}"
        return f"{SEG} and {_node_what(node, dom)} have different iteration domains"
    if k == "resize":
        if seg.kind in ("pointwise", "resize"):
            return None
        return f"no kernel template fuses {node.op} with {SEG}"
    # pointwise, view, write
    if seg.kind in ("pointwise", "resize"):
        if dom == seg.domain or _numel(dom) == _numel(seg.domain) or seg.kind == "resize":
            return None
        return f"{SEG} and {node.op} over {dom} have different iteration domains"
    # reduction / normalization segment
    rd = seg.reduced
    if dom in (seg.domain, _reduced_shape(seg.domain, rd), _keepdim_shape(seg.domain, rd)):
        return None
    return f"{SEG} and {node.op} over {dom} have different iteration domains"


def _laid_out_in(seg: Segment, node: Node) -> str | None:
    """The name of ``node``'s input that a stride_order of ``seg`` makes, if one is."""
    made = {id(o) for n in seg.nodes if n.op == "stride_order" for o in n.outputs}
    return next((v.name for v in node.inputs() if id(v) in made), None)


def seg_kind(node: Node) -> str:
    """The op family that decides segmentation: a reduction over size-1 dims only (thunder's
    decompositions emit them, e.g. ``sum`` of a ``[n, 1]`` mean gradient; a 0-dim input's
    "reduction" too) is a squeeze."""
    k = kind_of(node.op)
    if k == "reduction":
        shape = node.args[0].shape
        if all(d >= len(shape) or shape[d] == 1 for d in reduction_dims(node)):
            return "view"
    return k


def _choose(node, k, dom, latest, segments, barrier, hazards, seg_of):
    """The segment ``node`` joins, or ``(None, (reason, the segment it is about))``.

    Candidates keep the segment graph acyclic: every producer segment of ``node`` must come
    no later than the one it joins (edges then always point to higher indices). A dependent
    node tries its latest producer's segment first, then newer ones (a horizontal join of
    siblings, e.g. the two row sums of a layernorm backward); a node that reads only region
    inputs tries the newest segments first. The window is bounded, so segmentation stays
    linear in the number of ops. The reason returned is the one against the first candidate.
    """
    lo = max(latest.index if latest is not None else 0, barrier, 0)
    cands = segments[lo:] if latest is not None else segments[lo:][::-1]
    newest = cands[0] if cands else None
    if latest is None and k == "view" and newest is not None and _per_row_of(newest, dom):
        # a view of region inputs to one value per row moves no data: it joins the newest row
        # kernel, so its consumers may too (targets [b, s] viewed as [b * s] after the
        # logits' row kernel opened: the target's logit then joins that kernel, not a second)
        if hazards.conflict(node, newest, seg_of) is None:
            return newest, None
    first = None
    for seg in cands[:_WINDOW]:
        reason = _try_join(seg, node, k, dom, seg is latest)
        if reason is None:
            reason = hazards.conflict(node, seg, seg_of)
        if reason is None:
            return seg, None
        first = first or (reason, seg)
    return None, first


_WINDOW = 16


def _per_row_of(seg: Segment, dom) -> bool:
    """Is ``dom`` one value per row of ``seg``: its reduced or keepdim shape, or, for a
    pointwise segment that a row reduction may yet turn into a row kernel, the domain's
    leading dims?"""
    if seg.kind in ("reduction", "normalization") and seg.reduced is not None:
        return dom in (_reduced_shape(seg.domain, seg.reduced), _keepdim_shape(seg.domain, seg.reduced))
    d = tuple(dom)
    return seg.kind == "pointwise" and 0 < len(d) < len(seg.domain) and tuple(seg.domain[:len(d)]) == d


def segment_region(region: Region) -> list[Segment]:
    """Segments of ``region`` in execution order, each with inputs, outputs and the reason
    it is separate from the segment before it."""
    dom = iteration_domains(region)
    hazards = WriteHazards(region)
    seg_of: dict[int, Segment] = {}  # value id -> producing segment
    segments: list[Segment] = []

    def new_segment(node: Node, kind: str, why: tuple | None) -> Segment:
        d = dom[id(node)]
        reason, tried = why or (None, None)
        seg = Segment(len(segments), kind, d, split_reason=reason, split_from=tried)
        if seg_kind(node) == "reduction":
            seg.kind, seg.reduced = "reduction", reduction_dims(node)
        segments.append(seg)
        return seg

    barrier = -1  # index of the newest alias/reference segment: nothing joins before it
    writes = any(seg_kind(n) in ("write", "alias") for n in region.nodes)
    producer = {id(o): n for n in region.nodes for o in n.outputs}
    floating: dict[int, Node] = {}  # value id -> the view or cast of region inputs that makes it
    placed: dict[int, dict[int, Value]] = {}  # value id -> id(segment) -> its copy there
    returned = {id(v) for v in region.outputs}
    for node in region.nodes:
        if not writes and _floats(node, floating, producer, returned):
            floating[id(node.outputs[0])] = node
            continue
        k = seg_kind(node)
        producer_segs = list({id(seg_of[id(v)]): seg_of[id(v)] for v in node.inputs() if id(v) in seg_of}.values())
        if len(producer_segs) >= 2 and barrier < 0 and not writes:
            _hoist_per_row_values(list(producer_segs), segments, seg_of, producer)
        latest = max(producer_segs, key=lambda s: s.index) if producer_segs else None
        target, reason = None, None
        if k == "alias":
            reason = ("update_aliases orders reads of views after in-place writes", None)
        elif segments:
            target, reason = _choose(node, k, dom[id(node)], latest, segments, barrier, hazards, seg_of)
        if target is None:
            kind = "alias" if k == "alias" else ("resize" if k == "resize" else "pointwise")
            target = new_segment(node, kind, reason)
            if kind == "alias":
                barrier = target.index
        if any(id(v) in floating for v in node.inputs()):
            node = _with_floating(node, target, floating, placed, seg_of, dom)
        _add(target, node, dom[id(node)])
        for o in node.outputs:
            seg_of[id(o)] = target
        hazards.placed(node, target)

    recompute_reduction_inputs(region, segments, seg_of)
    segments = _chains_apart(segments, seg_of, dom, hazards.root)
    _finish(region, segments, seg_of)
    root = lambda v: id(hazards.root.get(id(v), v))  # noqa: E731
    for seg in segments:
        seg.touched_roots = frozenset(root(v) for n in seg.nodes for v in (*n.inputs(), *n.outputs) if v.is_tensor)
        seg.written_roots = frozenset(root(n.written) for n in seg.nodes if n.op in ("copy_", "copy_to_out_"))
    # a segment nothing reads and that writes nothing in place launches no kernel: thunder's
    # partition may leave an op in a region whose consumer recomputes it (a loss's upcast
    # beside the targets' count, ``rules/cross_entropy.py``)
    live = [seg for seg in segments if seg.outputs or any(seg_kind(n) == "write" for n in seg.nodes)]
    if len(live) < len(segments):
        for i, seg in enumerate(live):
            seg.index = i
        segments = live
    return segments


def _chains_apart(segments: list[Segment], seg_of: dict, dom: dict, roots: dict) -> list[Segment]:
    """Each pointwise segment's independent chains of work as segments of their own, in
    place of it (``chains.py`` says why); indices renumbered."""
    out: list[Segment] = []
    for seg in segments:
        chains = [seg.nodes]
        if seg.kind == "pointwise" and len(seg.nodes) > 1 and not seg.reduced_values and not seg.column_values:
            chains = independent_chains(seg.nodes, roots, seg.domain)
        for j, nodes in enumerate(chains):
            part = seg
            if j:
                part = Segment(0, "pointwise", dom[id(nodes[0])], split_from=seg,
                               split_reason=f"it shares no value and no written memory with {SEG}: blocks of its own")
            part.nodes = nodes
            part.reads = {id(x) for n in nodes for x in n.inputs()}
            for n in nodes:
                for o in n.outputs:
                    seg_of[id(o)] = part
            out.append(part)
    for i, seg in enumerate(out):
        seg.index = i
    return out


def _hoist_per_row_values(producer_segs: list[Segment], segments: list[Segment], seg_of: dict,
                          producer: dict) -> None:
    """Where a node reads values per row of an older segment (its domain's leading dims:
    a loss's count of the rows that count, from its targets) from a newer segment that
    depends on nothing at or after that older one, the newer segment moves to run just
    before it. The node may then join the older segment (a row kernel over the logits,
    opened first because the logits' view or upcast come first in the trace) and read
    them in its epilogue, rather than leave that work to a pass of its own. The order
    stays a topological one; only where no op of the region writes in place."""
    while len(producer_segs) >= 2:
        producer_segs.sort(key=lambda sg: sg.index)
        newer, older = producer_segs[-1], producer_segs[-2]
        d = tuple(newer.domain)
        if not (0 < len(d) < len(older.domain) and tuple(older.domain[:len(d)]) == d):
            return
        later = [v for sg, v in _reads_from(newer, seg_of) if sg.index >= older.index]
        # what it reads from those (the targets' flatten and compare, joined to the row kernel
        # as values per row) it computes again from region inputs, in cheap ops of at most
        # its size
        if later and not _recomputed(newer, later, producer, seg_of):
            return
        segments.insert(older.index, segments.pop(newer.index))
        for i, sg in enumerate(segments):
            sg.index = i
        producer_segs.remove(newer)


# views and casts of region inputs: no segment of their own; each segment that reads one
# computes it (a copy per segment), as its kernel reads the input through it
_FLOATING = ("broadcast_in_dim", "reshape", "squeeze", "transpose", "convert_element_type")


def _floats(node: Node, floating: dict, producer: dict, returned: set) -> bool:
    """Is ``node`` a view or cast of region inputs (or of such values) the region does not
    return? Those have no segment of their own: litgpt's cos and sin, sliced once for every
    layer, reach each layer's RoPE as region inputs viewed ``[1, 1, s, d]``, broadcast over
    the heads and cast; placed where they appear they opened segments that the rotation's
    multiply then joined, and the rotated halves went through memory in fp32 between two
    kernels (the H200's zoo: ``cat_neg`` and ``pointwise_group_add_mul`` in every layer)."""
    if node.op not in _FLOATING or len(node.outputs) != 1 or id(node.outputs[0]) in returned:
        return False
    tensors = node.tensor_inputs()
    return bool(tensors) and all(id(v) in floating or id(v) not in producer for v in tensors)


def _with_floating(node: Node, target: Segment, floating: dict, placed: dict, seg_of: dict, dom: dict) -> Node:
    """``node`` reading its floating inputs as made in ``target``: their nodes go into
    ``target`` first (copies with values of their own where another segment has them)."""
    clones: dict[int, Value] = {}

    def make(v: Value) -> Value:
        homes = placed.setdefault(id(v), {})
        if id(target) in homes:
            return homes[id(target)]
        n = floating[id(v)]
        for a in n.tensor_inputs():
            if id(a) in floating:
                clones[id(a)] = make(a)
        out = v if not homes else Value(f"{v.name}_f{target.index}", v.shape, v.dtype, v.is_tensor, v.broadcast_dims)
        copy = reading_clones(n, clones, (out,))
        dom[id(copy)] = dom[id(n)]
        _add(target, copy, dom[id(copy)])
        seg_of[id(out)] = target
        homes[id(target)] = out
        return out

    for v in node.inputs():
        if id(v) in floating:
            clones[id(v)] = make(v)
    reading = reading_clones(node, clones, node.outputs)
    dom[id(reading)] = dom[id(node)]
    return reading


def _reads_from(seg: Segment, seg_of: dict) -> list:
    """(segment, value) for each value ``seg`` reads from another segment."""
    return [(seg_of[id(v)], v) for n in seg.nodes for v in n.inputs()
            if seg_of.get(id(v)) not in (None, seg)]


def _recomputed(seg: Segment, values: list, producer: dict, seg_of: dict) -> bool:
    """Clone into ``seg`` (first) the cheap ops that compute ``values`` from region inputs,
    none larger than ``seg``'s domain, and make ``seg`` read the clones; False (nothing
    changed) where some value needs more."""
    cone: dict[int, Node] = {}
    stack = list(values)
    limit = _numel(seg.domain)
    while stack:
        x = stack.pop()
        n = producer.get(id(x))
        if n is None:  # a region input
            continue
        if not cheap(n) or x.numel > limit:
            return False
        if id(n) not in cone:
            cone[id(n)] = n
            stack.extend(a for a in n.inputs() if a.is_tensor)
    order = {id(n): i for i, n in enumerate(producer.values())}
    clones: dict[int, Value] = {}
    twins = []
    for n in sorted(cone.values(), key=lambda n: order[id(n)]):
        out = n.outputs[0]
        clones[id(out)] = Value(f"{out.name}_h{len(producer)}", out.shape, out.dtype, out.is_tensor,
                                out.broadcast_dims)  # a name of its own: twins of one value may be made twice
        twins.append(reading_clones(n, clones, (clones[id(out)],)))
        seg_of[id(clones[id(out)])] = seg
        producer[id(clones[id(out)])] = twins[-1]
    seg.nodes[:] = twins + [reading_clones(n, clones, n.outputs) if any(id(x) in clones for x in n.inputs()) else n
                            for n in seg.nodes]
    for n in seg.nodes:
        producer.update((id(o), n) for o in n.outputs)
    seg.reads = {id(x) for n in seg.nodes for x in n.inputs()}
    return True


def _add(seg: Segment, node: Node, d) -> None:
    k = seg_kind(node)
    if seg.kind in ("reduction", "normalization") and _joins_per_column(seg, node, k, d):
        if k == "reduction":
            seg.across = reduction_dims(node)
        seg.column_values.update(id(o) for o in node.outputs)
    elif k == "reduction":
        if seg.kind == "pointwise":
            seg.kind, seg.reduced = "reduction", reduction_dims(node)
        elif any(id(v) in seg.reduced_values for v in node.inputs()):
            seg.kind = "normalization"
        seg.reduced_values.update(id(o) for o in node.outputs)
    elif k == "resize" and seg.kind == "pointwise":
        seg.kind = "resize"
        if _numel(d) > _numel(seg.domain) or not seg.nodes:
            seg.domain = d
    else:
        # a resize segment iterates over its largest value (the cat output, not a slice)
        if seg.kind == "resize" and k in ("pointwise", "resize") and _numel(d) > _numel(seg.domain):
            seg.domain = d
        if any(id(v) in seg.reduced_values for v in node.inputs()):
            if seg.kind == "reduction" and d == seg.domain:
                seg.kind = "normalization"  # a reduction result broadcast back over its input
            seg.reduced_values.update(id(o) for o in node.outputs)
    seg.nodes.append(node)
    seg.reads.update(id(v) for v in node.inputs())


def _finish(region: Region, segments: list[Segment], seg_of: dict[int, Segment]) -> None:
    """Fill each segment's inputs (read from outside it) and outputs (read after it).

    A segment of metadata ops only (reshape, slice, squeeze, permute: splitting a fused QKV
    projection into q, k, v) becomes a ``view`` segment: it launches no kernel and returns
    views of its inputs, whatever their strides, so a consumer such as SDPA sees the
    producer's true layout and nothing is copied.
    """
    for seg in segments:
        if seg.kind in ("pointwise", "resize") and all(n.op in METADATA for n in seg.nodes):
            seg.kind = "view"
    region_out = {id(v) for v in region.outputs}
    read_later: dict[int, set[int]] = {}
    for seg in segments:
        seen = set()
        for node in seg.nodes:
            for v in node.inputs():
                p = seg_of.get(id(v))
                if p is not seg and id(v) not in seen:
                    seen.add(id(v))
                    seg.inputs.append(v)
                    if p is not None:
                        read_later.setdefault(id(p), set()).add(id(v))
    for seg in segments:
        later = read_later.get(id(seg), set())
        for node in seg.nodes:
            for o in node.outputs:
                if id(o) in later or id(o) in region_out:
                    seg.outputs.append(o)

