"""``thunder_fuser.graphed`` (issue 33): a step replayed as CUDA graphs keeps every in-place
update where the caller holds it. On the CPU a recording stand-in captures and replays (what
a graph does: a capture runs nothing, a replay reruns the captured work over the same
tensors), so the bookkeeping is tested here: inputs that keep their address are read and
written in place, moving inputs go through static buffers and back, a moved cache captures
anew, what cannot be captured runs as it is. The ``cuda`` tests take real graphs."""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch
from torch.utils._pytree import tree_flatten

import thunder_fuser
from test_decode import _decode_step
from thunder_fuser.functionalize import AliasError
from thunder_fuser.cudagraphs.graphs import GraphWarning, graphed


class RecordingGraphs:
    """A CUDA graph's contract on the CPU: ``capture`` leaves no effect (it runs the step to
    record it, then restores what it wrote), ``replay`` reruns it over the captured tensors
    and fills the captured outputs."""

    def __init__(self, fail: str | None = None):
        self.fail, self.replays = fail, 0

    def capture(self, run, inputs):
        if self.fail:
            raise RuntimeError(self.fail)
        saved = [t.clone() for t in inputs]
        out = run()
        for t, s in zip(inputs, saved):
            if torch._debug_has_internal_overlap(t) == 0:  # an expanded input cannot be written
                t.copy_(s)
        flat, _ = tree_flatten(out)

        def replay():
            self.replays += 1
            for o, n in zip(flat, tree_flatten(run())[0]):
                o.copy_(n)

        return replay, out, 0


def _weights():
    torch.manual_seed(0)
    return [torch.randn(64, 64) / 8 for _ in range(3)]


@pytest.mark.parametrize("jit", [False, True], ids=["eager step", "thunder + fuser step"])
def test_a_graphed_decode_step_writes_the_callers_cache_every_step(jit, torch_kernels):
    ws = _weights()
    step = thunder.jit(_decode_step, executors=thunder_fuser.executors()) if jit else _decode_step
    backend = RecordingGraphs()
    g = graphed(step, backend=backend)
    ours = [torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16)]
    theirs = [c.clone() for c in ours]
    captures = []
    for pos in range(10):
        if pos == 6:  # the caller moves its cache: a graph over the old pointers must not replay
            ours = [c.clone() for c in ours]
        x, at = torch.randn(1, 1, 64), torch.tensor([pos])
        got, want = g(x, *ours, at, *ws), _decode_step(x, *theirs, at, *ws)
        torch.testing.assert_close(got, want)
        for c, w in zip(ours, theirs):
            torch.testing.assert_close(c, w)
        captures.append(g.captures)
    assert backend.replays == 8 and captures[5] >= 1 and captures[6] > captures[5], captures


class _Cache:
    """What a transformers ``StaticCache`` is to its model: an object (not a module) that
    holds the layers' tensors, kept by the module and swapped for a new one between calls."""

    def __init__(self, k, v):
        self.layers = [k, v]


class _CachedStep(torch.nn.Module):
    def __init__(self, ws):
        super().__init__()
        self.wq, self.wk, self.wv = (torch.nn.Parameter(w, requires_grad=False) for w in ws)
        self.cache = _Cache(torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16))

    def forward(self, x, pos):
        return _decode_step(x, *self.cache.layers, pos, self.wq, self.wk, self.wv)


def test_a_cache_the_module_holds_and_swaps_captures_anew(torch_kernels):
    """The cache is no argument of the step: the module holds it, and the caller hands the
    module a new one midway. thunder's prologue fetches it each call; ``graphed`` refetches
    what that prologue fetches (``cudagraphs/held_tensors.py``), so the new cache's addresses capture a
    new graph (a real graph would replay over the old cache: ``test_decode.py``'s cuda test
    shows that), and replays resume after it. A parameter is fetched too, an argument not."""
    ws = _weights()
    module = _CachedStep(ws)
    theirs = [torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16)]
    backend = RecordingGraphs()
    g = graphed(thunder.jit(module, executors=thunder_fuser.executors()), backend=backend)
    captures = []
    for pos in range(10):
        if pos == 6:
            module.cache = _Cache(*(c.clone() for c in module.cache.layers))
        x, at = torch.randn(1, 1, 64), torch.tensor([pos])
        got, want = g(x, at), _decode_step(x, *theirs, at, *ws)
        torch.testing.assert_close(got, want)
        for c, w in zip(module.cache.layers, theirs):
            torch.testing.assert_close(c, w)
        captures.append(g.captures)
    assert captures[2:6] == [1, 1, 1, 1] and captures[6:] == [2, 2, 2, 2], captures
    assert backend.replays == 8 and not g.ungraphed, g.ungraphed
    (held,) = g.held.values()
    sig = held.signature((x, at), {})
    assert {t.data_ptr() for t in module.cache.layers} <= set(sig.ptrs)  # fetched again each call
    assert not {x.data_ptr(), at.data_ptr()} & set(sig.ptrs)  # the arguments are the graph's own key
    looked_up = [n for _, names in held.looked_up for n in names]
    assert sorted(looked_up) == ["wk", "wq", "wv"]  # in thunder's dictionary of parameters, each call


def test_a_counter_updated_in_place_in_a_graph(torch_kernels):
    def step(x, counter):
        counter.add_(1)
        return x * counter

    g = graphed(thunder.jit(step, executors=[thunder_fuser.fuser_ex]), backend=RecordingGraphs())
    counter = torch.zeros(())
    for i in range(6):
        x = torch.randn(4)
        torch.testing.assert_close(g(x, counter), x * (i + 1))
        assert counter.item() == i + 1


def test_inputs_aliasing_one_another_are_read_and_written_where_they_live():
    """The key and value caches as two views of one buffer (and, midway, of a new buffer each
    call): a copy of either into a static buffer would split the aliasing, so both are read
    in place, and every step's writes land in the caller's buffer."""
    ws = _weights()
    g = graphed(_decode_step, backend=RecordingGraphs())
    kv = torch.zeros(2, 1, 4, 16, 16)
    theirs = kv.clone()
    for pos in range(10):
        if pos >= 7:  # a new buffer each call from here: the pair moves together
            kv = kv.clone()
        x, at = torch.randn(1, 1, 64), torch.tensor([pos])
        got, want = g(x, kv[0], kv[1], at, *ws), _decode_step(x, theirs[0], theirs[1], at, *ws)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(kv, theirs)
    assert not g.ungraphed, g.ungraphed


def test_a_thunder_step_given_two_views_of_one_buffer_refuses_before_writing(torch_kernels):
    """thunder 0.2.6 traces inputs sharing storage as one tensor (with any executors: a wrong
    cache and wrong logits); through fuser_ex the call raises first, naming both inputs, and
    writes nothing. The same tensor passed twice is one view, and runs."""
    ws = _weights()
    step = graphed(thunder.jit(_decode_step, executors=thunder_fuser.executors()), backend=RecordingGraphs())
    kv = torch.zeros(2, 1, 4, 16, 16)
    with pytest.raises(AliasError, match="'k_cache' and 'v_cache' share storage as different views"):
        step(torch.randn(1, 1, 64), kv[0], kv[1], torch.tensor([0]), *ws)
    assert not kv.any()

    def double(a, b):
        a.add_(1)
        b.add_(2)
        return a * b

    jd = thunder.jit(double, executors=[thunder_fuser.fuser_ex])
    x, y = torch.zeros(3), torch.zeros(3)
    torch.testing.assert_close(jd(x, x), double(y, y))
    torch.testing.assert_close(x, y)


def test_a_moving_input_written_in_place_is_written_back():
    """An input at a new address each call goes through a static buffer: what the step writes
    into it reaches the caller's tensor after the replay."""
    def step(x, acc):
        acc.mul_(2)
        return acc + x

    g = graphed(step, backend=RecordingGraphs())
    for i in range(5):
        acc = torch.full((3,), float(i))  # new tensor each call
        out = g(torch.ones(3), acc)
        torch.testing.assert_close(acc, torch.full((3,), 2.0 * i))
        torch.testing.assert_close(out, torch.full((3,), 2.0 * i + 1))


def test_what_cannot_be_captured_runs_as_it_is():
    """CPU inputs (with the real CUDA backend: refused before any capture) and a failed
    capture (a host sync inside) run without a graph, right, with one warning naming why."""
    def step(x, y):
        return x + y

    g = graphed(step)  # CUDA graphs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            torch.testing.assert_close(g(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
    assert g.captures == 0 and any("not on a CUDA device" in w for w in g.ungraphed.values())
    assert sum(issubclass(w.category, GraphWarning) for w in caught) == 1

    g = graphed(step, backend=RecordingGraphs(fail="operation not permitted when stream is capturing (item)"))
    with pytest.warns(GraphWarning, match="capture failed: RuntimeError: operation not permitted"):
        for _ in range(4):
            torch.testing.assert_close(g(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))


@pytest.mark.cuda
def test_a_graphed_decode_step_on_cuda_graphs():
    ws = [w.cuda() for w in _weights()]
    step = thunder.jit(_decode_step, executors=thunder_fuser.executors())
    g = graphed(step)
    ours = [torch.zeros(1, 4, 16, 16, device="cuda"), torch.zeros(1, 4, 16, 16, device="cuda")]
    theirs = [c.clone() for c in ours]
    for pos in range(10):
        if pos == 6:
            ours = [c.clone() for c in ours]
        x, at = torch.randn(1, 1, 64, device="cuda"), torch.tensor([pos], device="cuda")
        got, want = g(x, *ours, at, *ws), _decode_step(x, *theirs, at, *ws)
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
        for c, w in zip(ours, theirs):
            torch.testing.assert_close(c, w, atol=1e-3, rtol=1e-3)
    assert g.captures >= 2 and not g.ungraphed, g.ungraphed


def test_an_input_that_keeps_moving_goes_through_a_static_buffer():
    """A tensor passed through the warm-up but new at every call after: one new capture for
    its first move, then a static buffer; the results stay right and the graphs few."""
    def step(x, w):
        return x * w

    g = graphed(step, backend=RecordingGraphs())
    w = torch.randn(8)
    x = torch.randn(8)
    for i in range(2):  # warm-up with the same x
        g(x, w)
    for i in range(10):
        x = torch.randn(8) + i  # a new tensor each call
        torch.testing.assert_close(g(x, w), x * w)
    assert g.captures == 2, g.captures


def test_a_new_tensor_on_its_predecessors_block_is_no_held_input():
    """A token made anew each call that the allocator puts on the block the last one freed
    (here forced: a new storage over the same memory each call) keeps its address through
    the warm-up without being the same tensor: it goes through a static buffer from the
    first replay, and its later moves capture nothing."""
    def step(x, w):
        return x * w

    g = graphed(step, backend=RecordingGraphs())
    w, block = torch.randn(8), bytearray(32)
    for i in range(2):  # warm-up: new storages, one address
        x = torch.frombuffer(block, dtype=torch.float32)
        x.copy_(torch.randn(8))
        torch.testing.assert_close(g(x, w), x * w)
    for i in range(6):
        x = torch.randn(8) + i
        torch.testing.assert_close(g(x, w), x * w)
    assert g.captures == 1, g.captures


def test_an_expanded_input_that_moves_is_read_in_place():
    """A mask expanded from a row (stride 0) at a new address each call: no buffer of its
    strides could hold a copy of it, so it is read where it lives."""
    def step(x, mask):
        return torch.where(mask, x, 0.0)

    g = graphed(step, backend=RecordingGraphs())
    for i in range(6):
        x = torch.randn(4, 8)
        mask = (torch.arange(8) < i).expand(4, 8)
        torch.testing.assert_close(g(x, mask), step(x, mask))
    assert g.captures >= 1 and not g.ungraphed, g.ungraphed
