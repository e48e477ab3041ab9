"""The host's mirror of a group's step counts (``optimizers/step_counts.py``): whatever
happens to the counts between steps, the counts it reports are the tensors' own, and its
``+= 1`` is torch's, bit for bit."""

import torch
from hypothesis import given, settings, strategies as st

from thunder_fuser.optimizers.step_counts import GroupCounts, TensorMirror


def _view(views: dict, mirror: TensorMirror, key, steps: list) -> GroupCounts:
    """What the jitted step does per group: the last view while it holds, else a new one."""
    counts = views.get(key)
    if counts is None or not counts.holds(steps):
        if counts is not None:
            counts.retire()
        counts = views[key] = GroupCounts(steps, mirror)
    return counts


EVENTS = st.one_of(
    st.just(("step",)),
    st.tuples(st.just("write"), st.integers(0, 5), st.sampled_from([0.0, 7.0, 2.0**24 - 1, 2.0**24])),
    st.tuples(st.just("skip"), st.integers(0, 5)),
    st.tuples(st.just("replace"), st.integers(0, 5)),
)


@settings(deadline=None, max_examples=60)
@given(st.lists(EVENTS, min_size=1, max_size=12), st.sampled_from([torch.float32, torch.float64]))
def test_the_mirrored_counts_are_the_tensors_and_their_increment_is_torchs(events, dtype):
    """Counts stepped, written by the user in place, a parameter without a gradient for a
    step (left out of that step's list), a count replaced by a new tensor (a loaded state):
    after each, the view's counts are the tensors' values, and its ``count()`` leaves what
    ``t += 1`` leaves on a copy (past 2**24 in fp32, where ``+= 1`` stops counting)."""
    steps = [torch.tensor(float(i % 2), dtype=dtype) for i in range(6)]
    views, mirror = {}, TensorMirror()
    for event in events:
        kind = event[0]
        if kind == "write":
            steps[event[1]].fill_(event[2])
            continue
        if kind == "replace":
            steps[event[1]] = torch.tensor(3.0, dtype=dtype)
            continue
        taken = [t for i, t in enumerate(steps) if not (kind == "skip" and i == event[1])]
        counts = _view(views, mirror, "group", taken)
        got = {i: c for c, members in counts.by_count().items() for i in members}
        assert [got[i] for i in range(len(taken))] == [float(t) for t in taken]
        want = [t.clone().add_(1) for t in taken]
        counts.count()
        assert all(torch.equal(t, w) for t, w in zip(taken, want))


def test_a_view_that_holds_reads_no_count_and_a_new_view_reads_only_what_moved(monkeypatch):
    steps = [torch.tensor(5.0) for _ in range(4)]
    views, mirror = {}, TensorMirror()
    _view(views, mirror, "g", steps).count()
    reads = []
    real = torch.Tensor.__float__
    monkeypatch.setattr(torch.Tensor, "__float__", lambda t: reads.append(t) or real(t))
    counts = _view(views, mirror, "g", steps)
    assert counts.by_count() == {6.0: [0, 1, 2, 3]} and reads == []
    counts.count()
    reads.clear()  # the count's own source
    steps[2].fill_(1.0)  # the user restarts one count
    counts = _view(views, mirror, "g", steps)
    assert counts.by_count() == {7.0: [0, 1, 3], 1.0: [2]}
    assert [t is steps[2] for t in reads] == [True]  # read again: the written count alone
