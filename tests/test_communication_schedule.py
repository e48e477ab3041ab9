"""``passes/communication_schedule.py`` (and ``dead_inputs``'s rule for what an async collective
sends) on small traces written out by hand: collectives and
what only feeds them as early as their inputs allow, waits and what is made of their results
alone just before their first reader, nothing else moved; and, for any trace, every op after
what it reads. (Under thunder's FSDP, ``test_distributed.py`` checks the same order in the
traces a training step runs.)"""

from __future__ import annotations

import signal
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_fuser.passes.communication_schedule import schedule_communication
from thunder.core.prims import OpTags  # noqa: E402 - after thunder_fuser (its torch compatibility)

AG, RS, WAIT = "torch_all_gather_prim_impl", "torch_reduce_scatter_prim_impl", "torch_wait_prim_impl"


def op(name: str, reads=(), makes=(), kind: str | None = None, tags=()):
    """A bound symbol as the pass reads it: ``kind`` is the symbol's name (a collective, a wait,
    ``matmul``...), ``name`` what the tests call it."""
    sym = SimpleNamespace(name=kind or name, id=kind or name, tags=tuple(tags), is_fusion=False)
    proxies = lambda names: [SimpleNamespace(name=n) for n in names]  # noqa: E731
    return SimpleNamespace(sym=sym, flat_proxy_args=proxies(reads), flat_proxy_outs=proxies(makes), subsymbols=[],
                           label=name)


def order(bsyms) -> list[str]:
    return [b.label for b in schedule_communication(bsyms)]


def two_gathered_layers(first, layer1_reads: str, layer2_weight: str) -> list:
    """Both layers' weights gathered and waited for at the top (the order the partition left),
    then ``first``, then the two layers."""
    return [op("ag1", ["p1"], ["f1"], AG), op("ag2", ["p2"], ["f2"], AG),
            op("w1", ["f1"], ["g1"], WAIT), op("w2", ["f2"], ["g2"], WAIT), first,
            op("layer1", [layer1_reads, "g1"], ["h1"]), op("layer2", ["h1", layer2_weight], ["h2"]),
            op("return", ["h2"], [], "python_return")]


def test_each_wait_goes_just_before_its_first_reader():
    trace = two_gathered_layers(op("emb", ["idx"], ["h"]), "h", "g2")
    assert order(trace) == ["ag1", "ag2", "emb", "w1", "layer1", "w2", "layer2", "return"]


def test_what_is_made_of_a_gathered_weight_alone_goes_with_its_wait():
    """The broadcast of the second layer's norm weight: placed early, it would hold the first
    layer until the second one's weight is gathered."""
    trace = two_gathered_layers(op("bcast2", ["g2"], ["b2"]), "x", "b2")
    assert order(trace) == ["ag1", "ag2", "w1", "layer1", "w2", "bcast2", "layer2", "return"]


def test_a_gradient_is_reduced_as_soon_as_it_is_made():
    """A weight's gradient matmul and its division by the world size only feed the
    reduce-scatter: all three go right after the activation gradient they read; the matmul on
    the backward's main path keeps its place."""
    trace = [op("dy", ["g"], ["dy"]), op("dx", ["dy", "w"], ["dx"], "matmul"),
             op("dx2", ["dx", "w0"], ["dx2"], "matmul"), op("dw", ["dy", "x"], ["dw"], "matmul"),
             op("div", ["dw"], ["dw2"]), op("rs", ["dw2"], ["fut"], RS), op("wait", ["fut"], ["dws"], WAIT),
             op("return", ["dx2", "dws"], [], "python_return")]
    assert order(trace) == ["dy", "dw", "div", "rs", "dx", "dx2", "wait", "return"]


def test_an_op_that_feeds_two_collectives_keeps_its_place():
    trace = [op("a", ["x"], ["a"]), op("b", ["a"], ["b"]), op("both", ["x"], ["s"]),
             op("rs1", ["s"], ["f1"], RS), op("rs2", ["s"], ["f2"], RS),
             op("w1", ["f1"], ["o1"], WAIT), op("w2", ["f2"], ["o2"], WAIT),
             op("return", ["b", "o1", "o2"], [], "python_return")]
    assert order(trace) == ["a", "b", "both", "rs1", "rs2", "w1", "w2", "return"]


def test_nothing_moves_where_an_op_writes_in_place():
    trace = [op("ag", ["p"], ["f"], AG), op("w", ["f"], ["g"], WAIT), op("x", ["i"], ["x"]),
             op("copy", ["x", "buf"], ["buf2"], tags=(OpTags.IN_PLACE,)), op("use", ["g", "buf2"], ["y"]),
             op("return", ["y"], [], "python_return")]
    assert order(trace) == ["ag", "w", "x", "copy", "use", "return"]


def test_random_draws_keep_their_place():
    trace = [op("a", ["x"], ["a"]), op("noise", ["i"], ["n"], tags=(OpTags.RANDOM_OP,)),
             op("rs", ["n"], ["f"], RS), op("w", ["f"], ["o"], WAIT), op("return", ["a", "o"], [], "python_return")]
    assert order(trace) == ["a", "noise", "rs", "w", "return"]


def test_deep_diamonds_of_lazy_ops_schedule_in_linear_time():
    """Made of one wait's result alone, a ladder of diamonds (each op read twice) that a
    collective reads: asking whether the collective may go as each input is made, readiness
    asked afresh at every op takes 2**depth steps (the 16-layer FSDP step that once never
    finished its first call had such a path)."""
    trace = [op("ag", ["p"], ["f"], AG), op("w", ["f"], ["v0"], WAIT)]
    depth = 100
    for k in range(depth):
        trace += [op(f"l{k}", [f"v{k}"], [f"l{k}"]), op(f"r{k}", [f"v{k}"], [f"r{k}"]),
                  op(f"j{k}", [f"l{k}", f"r{k}"], [f"v{k + 1}"])]
    trace += [op("x", ["i"], ["x"]), op("rs", ["x", f"v{depth}"], ["f2"], RS), op("w2", ["f2"], ["o"], WAIT),
              op("return", ["o"], [], "python_return")]
    old = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("exponential schedule")))
    signal.alarm(20)
    try:
        got = order(trace)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(got) == sorted(b.label for b in trace)
    assert got[:3] == ["ag", "x", "w"], "the wait ran before an op that does not need it"


@st.composite
def traces(draw):
    """A random trace in data-flow order: ops, collectives and their waits, random draws."""
    n = draw(st.integers(2, 30))
    bsyms, values, futures = [], ["in0", "in1"], []
    for i in range(n):
        kind = draw(st.sampled_from(["op", "op", "op", "random", "collective", "wait"]))
        if kind == "wait" and futures:
            fut = futures.pop(draw(st.integers(0, len(futures) - 1)))
            bsyms.append(op(f"w{i}", [fut], [f"v{i}"], WAIT))
        elif kind == "collective":
            bsyms.append(op(f"c{i}", [draw(st.sampled_from(values))], [f"f{i}"], draw(st.sampled_from([AG, RS]))))
            futures.append(f"f{i}")
            continue
        else:
            reads = draw(st.lists(st.sampled_from(values), min_size=1, max_size=3, unique=True))
            tags = (OpTags.RANDOM_OP,) if kind == "random" else ()
            bsyms.append(op(f"o{i}", reads, [f"v{i}"], tags=tags))
        values.append(f"v{i}")
    waits = [op(f"wf{k}", [f], [f"vf{k}"], WAIT) for k, f in enumerate(futures)]
    return bsyms + waits + [op("return", values + [f"vf{k}" for k in range(len(futures))], [], "python_return")]


@settings(max_examples=300, deadline=None)
@given(traces())
def test_every_op_still_runs_after_what_it_reads_and_random_draws_keep_their_order(trace):
    got = schedule_communication(trace)
    assert sorted(b.label for b in got) == sorted(b.label for b in trace)
    made: set[str] = set()
    for b in got:
        assert all(p.name in made or p.name.startswith("in") for p in b.flat_proxy_args), b.label
        made.update(p.name for p in b.flat_proxy_outs)
    draws = lambda seq: [b.label for b in seq if OpTags.RANDOM_OP in b.sym.tags]  # noqa: E731
    assert draws(got) == draws(trace)
    assert got[-1].label == "return"


def test_what_an_async_collective_sends_is_not_written_over_before_its_wait():
    """``dead_inputs``: a fusion after a reduce-scatter that is the last op to name its input
    must not write over it: NCCL reads it until the wait."""
    import thunder.core.devices as devices
    import thunder.core.dtypes as dtypes
    from thunder.core import prims
    from thunder.core.proxies import TensorProxy
    from thunder.core.trace import TraceCtx, tracectx

    from thunder_fuser.passes.dead_inputs import dead_inputs

    with tracectx(TraceCtx()):
        x, y, z, o = (TensorProxy(shape=(4,), device=devices.cpu, dtype=dtypes.float32) for _ in range(4))

    def bsym(name, reads, makes, fusion=False, sym_id=None):
        sym = SimpleNamespace(name=name, id=sym_id or name, tags=(), is_fusion=fusion)
        return SimpleNamespace(sym=sym, flat_proxy_args=list(reads), flat_proxy_outs=list(makes), subsymbols=[], tags=(),
                               args=(tuple(reads),))

    fut = SimpleNamespace(name="fut")
    made = bsym("fusion_a", [], [x], fusion=True)
    late = bsym("fusion_b", [x], [y], fusion=True)
    trace = SimpleNamespace(output=(y, z), bound_symbols=[
        made, bsym(RS, [x], [fut]), late, bsym(WAIT, [fut], [z]),
        bsym("python_return", [y, z], [], sym_id=prims.PrimIDs.RETURN)])
    assert dead_inputs(trace)[(y.name,)] == frozenset()
    trace.bound_symbols[1:4] = [bsym(RS, [o], [fut]), late, bsym(WAIT, [fut], [z])]
    assert dead_inputs(trace)[(y.name,)] == {x.name}  # the collective sends another tensor: x may go
