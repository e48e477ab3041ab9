"""A plan's generated straight-line code (``runtime/straight_line.py``): what it says, that
every call it does not fit (new strides, a misaligned pointer, a leaf requiring grad) takes
the general path before anything runs, and that it frees what the schedule frees.
``helpers.check_vs_eager`` calls every jitted function twice, so the whole suite runs the
second call through this code as well."""

from __future__ import annotations

import pytest
import thunder
import torch

from benchmarks.workloads import adam_step, gelu_bias, layernorm
from helpers import check_vs_eager
from thunder_fuser import fuser_ex
from thunder_fuser.runtime.region_runner import RegionRunner


def _runners(jfn) -> list[RegionRunner]:
    trace = thunder.last_traces(jfn)[-1]
    return [v for v in trace.python_ctx().values() if isinstance(v, RegionRunner)]


def _count_general_calls(runner: RegionRunner) -> list:
    """Wrap the runner's generated function: the list records each call it declined."""
    declined = []
    fast = runner.fast

    def counting(args):
        out = fast(args)
        if out is None:
            declined.append(1)
        return out

    runner.fast = counting
    return declined


GELU_SOURCE = """\
def run(args):
    a0, a1 = args
    if (type(a0) not in plain6 or a0.stride() != s7
            or type(a1) not in plain6 or a1.stride() != s8
            or a1.data_ptr() % 16 != 0
            or a0.data_ptr() % 16 != 0):
        return None
    t1 = empty_strided((8, 64), (64, 1), dtype=dt9, device=dev10)
    run_on_torch(part11, (a1, a0, t1, ))
    return [t1]
"""


def test_gelu_source_reads_as_the_call_it_makes(torch_kernels):
    """Guards first (each input's type and strides, then vector alignment), then one allocation and one launch;
    the broadcast bias goes as it is (the launch function builds its view from the base,
    ``Geometry.base_maps``); constants (strides, dtype, device, the kernel) are globals."""
    jfn, _ = check_vs_eager(gelu_bias, torch.randn(8, 64), torch.randn(64))
    (runner,) = _runners(jfn)
    assert runner.fast.source == GELU_SOURCE
    assert runner.fast.__globals__["s7"] == (1,) and runner.fast.__globals__["s8"] == (64, 1)


def test_slices_and_merged_dims_need_no_view_per_call(torch_kernels):
    """RoPE: cos and sin (broadcast over heads) go as they are, and so do q and k with their
    heads merged with the batch; each one's second half (a slice at an offset) goes beside
    its element offset; the launch function builds every view (``Geometry.base_maps``), so
    the call makes no ``as_strided`` (3-4 us each on the H100 host)."""
    from benchmarks.workloads import rope

    args = (torch.randn(2, 4, 16, 32), torch.randn(2, 2, 16, 32), torch.randn(16, 32), torch.randn(16, 32))
    jfn, _ = check_vs_eager(rope, *args)
    (runner,) = _runners(jfn)
    launches = [line for line in runner.fast.source.splitlines() if "run_on_torch" in line]
    assert len(launches) == 2 and "as_strided" not in runner.fast.source, runner.fast.source
    assert "(a1, a0, (a1, 16), a1, a2, t1, ))" in launches[0], launches  # q, cos, q's second half, ...
    assert "(a3, a0, (a3, 16), a3, a2, t2, ))" in launches[1], launches


def _split_heads(x, w):
    y = x[:, :, :8].reshape(2, 8, 2, 4).transpose(1, 2)
    return y * w, x[:, :, 8:].transpose(1, 2)


SPLIT_HEADS_SOURCE = """\
def run(args):
    a0, a1 = args
    if (type(a0) not in plain6 or a0.stride() != s7
            or type(a1) not in plain6 or a1.stride() != s8
            or a0.data_ptr() % 16 != 0
            or a1.data_ptr() % 16 != 0):
        return None
    t1 = empty_strided((2, 2, 8, 4), (64, 4, 8, 1), dtype=dt9, device=dev10)
    run_on_torch(part11, (reinterpret(a0, (2, 16, 4), (4, 12, 1), 0), a1, t1, ))
    t2 = a0.as_strided((2, 4, 8), (96, 1, 12), a0.storage_offset() + 8)
    return [t1, t2]
"""


def test_views_of_an_argument_cost_one_call_where_needed(torch_kernels):
    """A chain of views of an argument (slice, reshape, transpose) is no torch call per op:
    a kernel's operand is one ``reinterpret`` of the argument (torch.compile's
    ``reinterpret_tensor``: no view bookkeeping, for a tensor dropped after the launch), an
    output one ``as_strided`` at the argument's offset plus the view's, and a view that only
    other views read is never made. The output is still a view of the caller's tensor."""
    x, w = torch.randn(2, 8, 12), torch.randn(4)
    jfn, _ = check_vs_eager(_split_heads, x, w)
    (runner,) = _runners(jfn)
    assert runner.fast.source == SPLIT_HEADS_SOURCE
    xs = torch.randn(3, 2, 8, 12)[1]  # at a storage offset: views of it count from there
    got = jfn(xs, w)
    for g, e in zip(got, _split_heads(xs, w)):
        torch.testing.assert_close(g, e)
    assert got[1]._is_view() and got[1].untyped_storage().data_ptr() == xs.untyped_storage().data_ptr()
    assert got[1].storage_offset() == xs.storage_offset() + 8 and got[1].stride() == (96, 1, 12)


def test_a_window_at_another_offset_takes_the_same_kernel(torch_kernels):
    """``x[:, pos:pos + 4]``: the window's offset goes to the launch beside ``x``, not
    into the kernel, so every window but the first (no offset at all) shares one kernel;
    its dims merge with the row (a slice of the run's outermost dim)."""
    from helpers import plans

    def window(x, pos: int):
        return x[:, pos:pos + 4] * 2

    signatures, offsets = set(), []
    for pos in (4, 8, 12):
        jfn, _ = check_vs_eager(window, torch.randn(2, 16, 8), pos)
        (runner,) = _runners(jfn)
        assert "as_strided" not in runner.fast.source, runner.fast.source
        (plan,) = plans(thunder.last_traces(jfn)[-1])
        (part,) = plan.kernels[0].parts
        signatures.add(part.geo.signature())
        offsets.append(part.geo.call_views[0][1])
    assert len(signatures) == 1 and offsets == [32, 64, 96], (signatures, offsets)


def test_new_strides_and_misaligned_pointers_take_the_general_path(torch_kernels):
    x, b = torch.randn(8, 64), torch.randn(64)
    jfn, _ = check_vs_eager(gelu_bias, x, b)
    (runner,) = _runners(jfn)
    declined = _count_general_calls(runner)
    torch.testing.assert_close(jfn(x, b), gelu_bias(x, b))
    assert declined == []
    xt = torch.randn(64, 8).t()  # new strides: a second plan
    torch.testing.assert_close(jfn(xt, b), gelu_bias(xt, b))
    assert declined == [1] and len(runner.plans) == 2
    xm = torch.randn(8 * 64 + 1)[1:].view(8, 64)  # 4 bytes past a 16-byte boundary
    torch.testing.assert_close(jfn(xm, b), gelu_bias(xm, b))
    assert declined == [1, 1]
    torch.testing.assert_close(jfn(x, b), gelu_bias(x, b))
    assert declined == [1, 1]


def test_in_place_update_of_a_leaf_requiring_grad_still_raises():
    def f(a):
        a.mul_(2)
        return a

    jfn = thunder.jit(f, executors=[fuser_ex])
    a = torch.randn(3)
    jfn(a)
    jfn(a)
    (runner,) = _runners(jfn)
    assert runner.fast is not None
    leaf = torch.randn(3, requires_grad=True)
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        jfn(leaf)
    torch.testing.assert_close(leaf.detach(), before)


@pytest.mark.parametrize("mode", ["torch", "off"])
def test_every_benchmark_shaped_region_gets_straight_line_code(monkeypatch, mode):
    """With kernels (run by torch) or with every segment on the reference backend."""
    monkeypatch.setenv("THUNDER_FUSER_KERNELS", mode)
    cases = [
        (gelu_bias, (torch.randn(8, 64), torch.randn(64))),
        (layernorm, (torch.randn(8, 64), torch.randn(64), torch.randn(64))),
        (adam_step, tuple([torch.randn(64), torch.randn(3, 5)] for _ in range(4))),
    ]
    for fn, args in cases:
        jfn, _ = check_vs_eager(fn, *args)
        assert all(r.fast is not None for r in _runners(jfn)), fn.__name__


def test_the_schedule_frees_intermediates_as_the_call_goes(torch_kernels):
    """A region of several steps deletes an intermediate after its last reader."""

    def f(x):
        s = torch.softmax(x, -1)
        return (s * 2).sum(0) + 1

    jfn, _ = check_vs_eager(f, torch.randn(16, 32))
    sources = [r.fast.source for r in _runners(jfn)]
    assert any("\n    del t" in src for src in sources), sources


def test_region_calls_as_profiler_ranges_when_asked(monkeypatch):
    """``THUNDER_FUSER_RANGES=1``: each region call is a profiler range of its name (what
    ``scripts/decode_profile.py`` attributes kernels by), and its results are unchanged."""
    monkeypatch.setenv("THUNDER_FUSER_RANGES", "1")

    def f(x, w):
        return (torch.relu(x) * 2 @ w).sum(1)

    jfn = thunder.jit(f, executors=[fuser_ex])
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    jfn(x, w)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = jfn(x, w)
    torch.testing.assert_close(got, f(x, w))
    ranges = {e.name for e in prof.events()}
    assert {r.__name__ for r in _runners(jfn)} <= ranges


def test_every_region_of_a_models_step_gets_straight_line_code(monkeypatch):
    """Forward and backward of a training step of pythia-410m (two layers, its real widths,
    bf16): every region takes its generated code from the second call on. Its partial rotary
    reads slices of the fused qkv projection, views an earlier segment takes of an argument:
    their vector alignment is checked on the argument (its pointer plus the view's offset)
    up front, where the code had declined them as pointers known only after a launch (on
    the H100 two regions a step took the general path, each op through the reference
    backend's interpreter)."""
    import litgpt

    import thunder_fuser
    from benchmarks.model_zoo import LitGPTWithLoss

    monkeypatch.setenv("THUNDER_FUSER_KERNELS", "torch")
    # two layers (one does not show it) at its real widths, of a small vocabulary (the
    # head's CPU matmuls in bf16 took most of two minutes, and it has no view to align)
    torch.manual_seed(0)
    cfg = litgpt.Config.from_name("pythia-410m", n_layer=2, padded_vocab_size=1024, vocab_size=1000)
    module = LitGPTWithLoss(litgpt.GPT(cfg)).to(torch.bfloat16)
    idx, targets = torch.randint(0, 1000, (2, 64)), torch.randint(0, 1000, (2, 64))
    jfn = thunder.jit(module, executors=thunder_fuser.executors())
    for _ in range(2):
        jfn(idx, targets).backward()
    runners = _runners(jfn) + [v for v in thunder.last_backward_traces(jfn)[-1].python_ctx().values()
                                if isinstance(v, RegionRunner)]
    assert runners and [r.__name__ for r in runners if r.fast is None] == []


@pytest.mark.cuda
def test_cuda_allocations_take_the_fast_path_while_the_device_is_current():
    """On a CUDA device the code allocates with torch.compile's ``empty_strided_cuda``
    (no argument parsing), which allocates on the current device: the function checks
    first that the region's device is current, and otherwise takes the general path."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x, b = torch.randn(8, 64, device="cuda"), torch.randn(64, device="cuda")
    jfn, _ = check_vs_eager(gelu_bias, x, b)
    (runner,) = _runners(jfn)
    src = runner.fast.source
    assert "empty_cuda((8, 64), (64, 1), dt" in src and f"cuda_device() != {x.device.index or 0}" in src, src
    declined = _count_general_calls(runner)
    torch.testing.assert_close(jfn(x, b), gelu_bias(x, b))
    assert declined == []


def test_thunder_floor_frees_region_calls_and_restores_them(torch_kernels):
    """``scripts/thunder_floor.py``'s floor: within ``free_regions`` every region call
    returns the outputs of the one call it recorded (nothing runs), after it the code again."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "scripts" / "thunder_floor.py"
    spec = importlib.util.spec_from_file_location("thunder_floor", path)
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    x, b = torch.randn(8, 64), torch.randn(64)
    jfn, _ = check_vs_eager(gelu_bias, x, b)
    (runner,) = _runners(jfn)
    fast = runner.fast
    with floor.free_regions(lambda: jfn(x, b)) as calls:
        assert calls == 1
        first = jfn(x, b)
        assert jfn(torch.zeros_like(x), b) is not None
        assert torch.equal(jfn(torch.zeros_like(x), b), first)  # the recorded outputs, not zeros'
    assert runner.fast is fast
    torch.testing.assert_close(jfn(torch.zeros_like(x), b), gelu_bias(torch.zeros_like(x), b))


def test_an_alignment_check_another_implies_is_dropped():
    """``(value, alignment, residue)``: a pointer at residue 8 modulo 16 is at 0 modulo 8, so
    that check goes; one that contradicts it stays (the call then takes the general path)."""
    from thunder_fuser.runtime.straight_line import _strongest

    checks = [(1, 8, 0), (1, 16, 0), (2, 8, 0), (2, 16, 8), (3, 8, 4), (3, 16, 0), (1, 16, 0)]
    assert _strongest(checks) == [(1, 16, 0), (2, 16, 8), (3, 8, 4), (3, 16, 0)]
