import pytest
import torch

from thunder_fuser import _compat


def test_thunder_imports_and_stubs_raise_clearly():
    import thunder  # noqa: F401  (would raise AttributeError without the stubs on torch 2.13)

    for name in _compat.NAMED_TENSOR_METHODS:
        assert hasattr(torch.Tensor, name)


def test_changes_nothing_on_a_torch_that_has_the_methods(monkeypatch):
    class FakeTensor:
        pass

    originals = {}
    for name in _compat.NAMED_TENSOR_METHODS:
        fn = lambda self, _n=name: _n  # noqa: E731
        setattr(FakeTensor, name, fn)
        originals[name] = fn
    monkeypatch.setattr(_compat.torch, "Tensor", FakeTensor)
    assert _compat.restore_named_tensor_stubs() == ()
    for name, fn in originals.items():
        assert getattr(FakeTensor, name) is fn


def test_adds_every_missing_method(monkeypatch):
    class FakeTensor:
        pass

    monkeypatch.setattr(_compat.torch, "Tensor", FakeTensor)
    assert _compat.restore_named_tensor_stubs() == _compat.NAMED_TENSOR_METHODS
    try:
        FakeTensor().align_as(None)
    except RuntimeError as e:
        assert "named tensors" in str(e)
    else:
        raise AssertionError("stub should raise")


def test_thunders_autograd_dummies_are_made_without_torchs_python_randn():
    """thunder's autograd glue makes its meta dummies with ``torch.empty`` (``patches/meta_dummy.py``):
    the same meta tensor, without torch's Python reference randn; any other randn is torch's."""
    import thunder.executors.torch_autograd as glue

    import thunder_fuser.patches.meta_dummy as meta_dummy

    assert isinstance(glue.torch, meta_dummy._TorchWithCheapMetaRandn) and glue.torch.autograd is torch.autograd
    d = glue.torch.randn(1, device="meta", requires_grad=True)
    assert d.device.type == "meta" and d.shape == (1,) and d.requires_grad and d.dtype == torch.float32
    torch.manual_seed(0)
    a = glue.torch.randn(3, 4)
    torch.manual_seed(0)
    assert torch.equal(a, torch.randn(3, 4))
    assert meta_dummy.cheapen_thunders_meta_dummies()  # a second call keeps the proxy


def test_the_quick_alias_key_answers_as_thunders_own():
    """``patches/alias_keys.py``: the key thunder picks its trace by, for tensors that share
    no storage, share it (a view, the same tensor twice), parameters, numbers and nested
    arguments, is thunder's own; a jitted function gets it."""
    import thunder

    from thunder_fuser.patches.alias_keys import quick_alias_key

    a, b = torch.randn(4, 4), torch.randn(4)
    p = torch.nn.Parameter(torch.randn(3))
    calls = []

    def thunders(*args, **kwargs):  # what thunder answers, recorded
        calls.append(args)
        groups = {}
        for i, t in enumerate(args):
            if type(t) is torch.Tensor:
                groups.setdefault(t.untyped_storage().data_ptr(), []).append(i)
        return "-".join(",".join(map(str, g)) for g in groups.values() if len(g) > 1)

    key = quick_alias_key(thunders)
    assert key(a, b, p, 2, None) == "" and not calls
    assert key(a, b, a[1]) == "0,2" and len(calls) == 1
    assert key(a, b, a) == "0,2"
    assert key([a, a]) == thunders([a, a])  # a nested argument: thunder flattens it
    assert key(a, x=a) == thunders(a, x=a)
    calls.clear()  # lists, dicts and keyword constants sharing nothing: a jitted optimizer update's call
    assert key([a, p], (b,), {"w": torch.randn(2)}, lr=0.1, amsgrad=False, dtype=torch.float32) == "" and not calls
    assert key([a], [a[0]], lr=0.1) == thunders([a], [a[0]], lr=0.1) and len(calls) == 2
    key([a], object())  # something the walk does not know: thunder answers
    assert len(calls) == 3

    jfn = thunder.jit(lambda x, y: x + y)
    populate = thunder.compile_data(jfn).populate_cache_info
    cells = dict(zip(populate.__code__.co_freevars, populate.__closure__))
    assert hasattr(cells["_alias_tensor_of_args_kwargs"].cell_contents, "original")
    x = torch.randn(4)
    torch.testing.assert_close(jfn(x, x[None, 0].expand(4)), x + x[0])



def _thunders_alias_key():
    """thunder's own ``_alias_tensor_of_args_kwargs``, from a jitted function's closure."""
    import thunder

    populate = thunder.compile_data(thunder.jit(lambda x: x)).populate_cache_info
    cells = dict(zip(populate.__code__.co_freevars, populate.__closure__))
    return cells["_alias_tensor_of_args_kwargs"].cell_contents.original


def test_the_quick_alias_key_is_thunders_on_any_nesting_of_shared_and_separate_tensors():
    """Property (hypothesis): arguments and keywords nested in lists, tuples and dicts, of
    tensors (separate ones, views of one base, the same tensor twice, a sparse one),
    parameters, numbers, strings, ``None``, dtypes and a ``torch.Size``: the quick key
    equals thunder's, whatever it answers."""
    from hypothesis import given, settings, strategies as st

    from thunder_fuser.patches.alias_keys import quick_alias_key

    thunders = _thunders_alias_key()
    key = quick_alias_key(thunders)
    base, alone = torch.randn(6, 4), torch.randn(3)
    leaves = st.sampled_from([base, base[1], base.t(), alone, torch.randn(2), torch.nn.Parameter(torch.randn(2)),
                              torch.randn(2, 2).to_sparse(), 0, 1.5, True, None, "s", torch.float32,
                              torch.Size([2, 3]), torch.tensor(2.0)])
    trees = st.recursive(leaves, lambda kids: st.lists(kids, max_size=4) | st.tuples(kids, kids)
                         | st.dictionaries(st.sampled_from("abc"), kids, max_size=3), max_leaves=12)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(trees, max_size=4), st.dictionaries(st.sampled_from(["x", "lr", "ps"]), trees, max_size=3))
    def same_key(args, kwargs):
        assert key(*args, **kwargs) == thunders(*args, **kwargs)

    same_key()

def _profiled(x, w):
    with torch.profiler.record_function("attention"):
        y = torch.softmax(x @ w, -1)
    with torch.autograd.profiler.record_function("tail"):
        return y * 2


def test_a_profiler_range_inside_a_jitted_function_traces_as_nothing():
    """``patches/profiler_ranges.py``: thunder 0.2.6 refused ``record_function`` (its custom op
    ``profiler._record_function_enter_new``) with every executor; the range is left out of the
    trace, what it encloses is traced, values and gradients are eager's."""
    import thunder

    import thunder_fuser

    jfn = thunder.jit(_profiled, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
    got, want = jfn(x, w), _profiled(x2, w2)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close((x.grad, w.grad), (x2.grad, w2.grad))


def test_thunder_jit_of_an_optimizers_step():
    """Past the profiler range every optimizer's step opens with, thunder 0.2.6's
    ``thunder.jit(opt.step)`` meets ``grad.is_sparse`` (a proxy has none), and past that
    ``self.state[p]``: the optimizer's state is a dict keyed by its parameters, which a
    traced parameter finds nothing in. ``patches/jit_optimizer_step.py`` hands torch's own
    steps to ``optimizers/jitted_step.py``; without the patch thunder still fails so."""
    import thunder

    import thunder_fuser
    from thunder_fuser.optimizers.jitted_step import JittedOptimizerStep

    p = torch.nn.Parameter(torch.randn(4, 4))
    p.grad = torch.randn(4, 4)
    opt = torch.optim.AdamW([p], lr=0.1)
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    assert isinstance(step, JittedOptimizerStep)
    step()
    step()
    assert (step.eager_steps, step.jitted_steps) == (1, 1)
    unpatched = thunder.jit.__wrapped__
    with pytest.raises(AttributeError, match="is_sparse"):
        unpatched(opt.step, executors=thunder_fuser.executors())()


def _add_pairs(xs, ys, extra=None):
    for x, y in zip(xs, ys):
        x.add_(y)
    for x in (extra or {}).get("more", []):
        x.mul_(2)


@pytest.mark.parametrize("executors", ["thunder's", "ours"])
def test_a_trace_made_for_a_list_of_n_never_runs_for_a_longer_list(executors):
    """``patches/sequence_lengths.py``: thunder's prologue reads a list by index and checked
    no length, so a trace for 3 pairs ran for 4 and left the fourth ``x`` as it was. Every
    call, each list (nested in a dict too) of a length met before or new: eager's results."""
    import thunder

    import thunder_fuser

    jfn = thunder.jit(_add_pairs, **({"executors": thunder_fuser.executors()} if executors == "ours" else {}))
    for n, m in [(3, 0), (4, 0), (3, 0), (2, 1), (2, 3), (5, 3), (2, 1)]:
        xs, ys, more = [torch.randn(3) for _ in range(n)], [torch.randn(3) for _ in range(n)], [torch.randn(2) for _ in range(m)]
        want = [x + y for x, y in zip(xs, ys)] + [x * 2 for x in more]
        with torch.no_grad():
            jfn(xs, ys, {"more": more})
        torch.testing.assert_close(xs + more, want)


def test_the_lengths_key_reads_every_nested_sequence():
    from thunder_fuser.patches.sequence_lengths import sequence_lengths

    t = torch.ones(1)
    assert sequence_lengths(([t, t], (t,), 3), {"a": {"b": [t, [t, t]]}}) == "2,1,d1,2,2"
    assert sequence_lengths((t, 1.0), {}) == ""
