"""The segmenter as a pass on its own: properties over random regions, and its rules.

Regions are built directly in the IR (no thunder), so these run in milliseconds.
"""

from collections import Counter

import torch
from hypothesis import given
from hypothesis import strategies as st

import thunder
from benchmarks.segmentation_time import stacked_region
from helpers import check_vs_eager
from thunder_fuser import explain, fuser_ex
from thunder_fuser.backends.reference import run_nodes
from thunder_fuser.ir.region import Node, Region, Value
from thunder_fuser.segment.segmenter import _FLOATING
from thunder_fuser.inspect.printing import op_line
from thunder_fuser.segment import schedule_segments, segment_region

FULL, ROWS, COLS = (4, 6), (4,), (6,)


@st.composite
def random_regions(draw):
    """Random DAGs of pointwise ops, broadcasts and row/column sums over a [4, 6] domain."""
    inputs = [Value("x", FULL, torch.float32), Value("r", ROWS, torch.float32), Value("c", COLS, torch.float32)]
    pool = {FULL: [inputs[0]], ROWS: [inputs[1]], COLS: [inputs[2]]}
    nodes = []
    for i in range(draw(st.integers(1, 25))):
        out_shape = draw(st.sampled_from([FULL, FULL, ROWS, COLS]))
        choice = draw(st.integers(0, 2))
        if out_shape == FULL and choice == 0:
            src_shape = draw(st.sampled_from([ROWS, COLS]))
            src = draw(st.sampled_from(pool[src_shape]))
            node = Node("broadcast_in_dim", (src, list(FULL), (0,) if src_shape == ROWS else (1,)), {}, ())
        elif out_shape != FULL and choice == 0:
            src = draw(st.sampled_from(pool[FULL]))
            node = Node("sum", (src, (1,) if out_shape == ROWS else (0,)), {}, ())
        elif choice == 1:
            node = Node(draw(st.sampled_from(["exp", "neg", "tanh"])), (draw(st.sampled_from(pool[out_shape])),), {}, ())
        else:
            a, b = (draw(st.sampled_from(pool[out_shape])) for _ in range(2))
            node = Node(draw(st.sampled_from(["add", "mul", "sub"])), (a, b), {}, ())
        out = Value(f"t{i}", out_shape, torch.float32)
        node.outputs = (out,)
        nodes.append(node)
        pool[out_shape].append(out)
    outputs = list({id(n.output): n.output for n in draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=4))}.values())
    return Region("random", inputs, nodes, outputs)


def _fresh_inputs():
    return [torch.randn(FULL).tanh(), torch.randn(ROWS).tanh(), torch.randn(COLS).tanh()]


@given(random_regions())
def test_segments_partition_the_region_acyclically_and_compute_the_same_values(region):
    segments = segment_region(region)
    # every node in at most one segment; the others are copies in reduction segments, which
    # recompute their cheap inputs (segment/recompute.py), copies of views and casts of
    # region inputs in each segment that reads them (``segmenter._floats``), or nodes that
    # read those copies
    originals = {id(n) for n in region.nodes}
    placed = [n for s in segments for n in s.nodes]
    assert len({id(n) for n in placed}) == len(placed)
    made = Counter(id(o) for n in placed for o in n.outputs)
    assert all(made[id(o)] == 1 for n in region.nodes for o in n.outputs if id(o) in made)
    copied = {id(o) for s in segments for n in s.nodes if id(n) not in originals for o in n.outputs}
    assert all(s.kind == "reduction" or n.op in _FLOATING or any(id(v) in copied for v in n.inputs())
               for s in segments for n in s.nodes if id(n) not in originals)
    # every node whose output a later segment or the region reads is placed
    needed = {id(v) for n in placed for v in n.inputs()} | {id(o) for o in region.outputs}
    assert all(id(o) in made for n in region.nodes for o in n.outputs if id(o) in needed)
    # edges go from lower to higher index: the segment graph is acyclic
    seg_of = {id(o): s.index for s in segments for n in s.nodes for o in n.outputs}
    for s in segments:
        for n in s.nodes:
            for v in n.inputs():
                assert seg_of.get(id(v), -1) <= s.index
    # same region, same segments
    again = segment_region(region)
    assert [[op_line(n) for n in s.nodes] for s in again] == [[op_line(n) for n in s.nodes] for s in segments]
    # the schedule computes what program order computes
    args = _fresh_inputs()
    env_prog = {id(v): a for v, a in zip(region.inputs, args)}
    run_nodes(region.nodes, env_prog)
    env_seg = {id(v): a for v, a in zip(region.inputs, args)}
    sched = schedule_segments(region, segments)
    # a launch step's segments read nothing of each other, so one launch may run them together
    assert [s for step in sched.steps for s in step] == sched.order
    for step in sched.steps:
        made = {id(o) for s in step for o in s.outputs}
        assert len(step) == 1 or not any(id(v) in made for s in step for v in s.inputs)
    for seg in sched.order:
        run_nodes(seg.nodes, env_seg)
        for v in sched.free_after.get(seg.index, ()):
            env_seg.pop(id(v), None)
    for o in region.outputs:
        torch.testing.assert_close(env_seg[id(o)], env_prog[id(o)])


def test_one_template_per_segment_over_a_stack_of_norms():
    segments = segment_region(stacked_region(200))
    assert {s.kind for s in segments} <= {"pointwise", "reduction", "normalization"}
    # a column norm after a row norm over the same tensor cannot share a kernel
    assert all(s.split_reason for s in segments[1:])


def test_transposed_input_makes_a_transpose_segment_and_explain_says_so():
    def f(x, y):  # the contiguous operand first: eager lays the output out as it (TensorIterator)
        return y + x

    jfn, out = check_vs_eager(f, torch.randn(8, 16).t(), torch.randn(16, 8))
    assert out.stride() == (8, 1)
    assert "segment 0 runs as transpose" in explain(jfn)


def test_same_trace_same_segments_text():
    def f(x, b):
        return torch.softmax(x + b, -1).sum(0)

    texts = []
    for _ in range(2):
        jfn = thunder.jit(f, executors=[fuser_ex])
        jfn(torch.randn(4, 8), torch.randn(8))
        texts.append(explain(jfn))
    assert texts[0] == texts[1]


def test_dump_env_var_prints_each_stage(monkeypatch, capsys):
    monkeypatch.setenv("THUNDER_FUSER_DUMP", "region,segments,layout")

    def f(x, b):
        return torch.softmax(x + b, -1)

    check_vs_eager(f, torch.randn(4, 8), torch.randn(8))
    err = capsys.readouterr().err
    first = "fuser0 (partition: regions before rematerialization)"
    assert f"[thunder_fuser:region]\n{first}\nt0 = prims.broadcast_in_dim(b, (4, 8), (1,))" in err
    assert "[thunder_fuser:segments]\nfuser0 (final build: the regions the trace calls)\nsegment 0 [normalization: amax over dims (1,)]  (b, x) -> (t16)" in err
    assert "[thunder_fuser:layout]\nfuser0: inputs b order (0,), x order (0, 1)\n  output t16 (4, 8) allocation order (0, 1)" in err


def test_softmax_of_a_zero_dim_tensor():
    # a reduction over the dim of a 0-dim tensor is a squeeze, not a kernel
    check_vs_eager(lambda x: torch.softmax(x, 0), torch.randn(()))


def test_a_layernorm_backward_takes_its_weight_and_bias_gradients_per_column_beside_its_rows():
    """The weight and bias gradients (sums over the rows) join the input gradient's row
    segment as sums per column: x, grad, mean and rstd are read once, and no full-size
    intermediate (an fp32 x_hat * grad) is stored for a second kernel. The segment says so."""
    import torch.nn.functional as F

    from helpers import check_gradients
    from thunder_fuser.inspect.explain import _fusions

    def ln(x, w, b):
        return F.layer_norm(x, (256,), w, b)

    for dt in (torch.float32, torch.bfloat16):
        x, w, b = torch.randn(64, 256, dtype=dt), torch.randn(256, dtype=dt), torch.randn(256, dtype=dt)
        if dt == torch.float32:
            jfn = check_gradients(ln, x, [w, b])
        else:  # eager's bf16 weight gradient rounds its sum: only the segments are checked
            jfn = thunder.jit(ln, executors=[fuser_ex])
            out = jfn(*(t.requires_grad_() for t in (x, w, b)))
            out.backward(torch.ones_like(out))
        runners = list(_fusions(thunder.last_backward_traces(jfn)[-1]))
        (seg,) = [s for r in runners for s in r.segments]
        assert seg.kind == "normalization" and seg.reduced == (1,) and seg.across == (0,)
        assert seg.describe() == "normalization: sum over dims (1,), sum over dims (0,) per column"
        sums = [n for n in seg.nodes if n.op == "sum" and n.args[1] == (0,)]
        assert len(sums) == 2
        stored = [o for s in runners[0].segments for o in s.outputs if not any(o is v for v in runners[0].region.outputs)]
        assert not stored



def test_a_segment_nothing_reads_and_that_writes_nothing_is_dropped():
    """thunder's partition may leave an op in a region whose consumer computes it again (a
    loss's upcast beside the count of its targets): its segment would launch for nothing."""
    x, r = Value("x", FULL, torch.float32), Value("r", ROWS, torch.float32)
    dead, total = Value("dead", FULL, torch.float32), Value("total", (), torch.float32)
    region = Region("dead", [x, r], [Node("exp", (x,), {}, (dead,)), Node("sum", (r, (0,)), {}, (total,))], [total])
    segments = segment_region(region)
    assert [[n.op for n in s.nodes] for s in segments] == [["sum"]]
    assert [s.index for s in segments] == [0]
