"""An optimizer's step through thunder + fuser, the way the seed measured it:
``torch.compile(optimizer.step, backend=ThunderCompiler(executors=thunder_fuser.executors()))``.
A step is in-place updates of many tensors (parameters, moments, the step counter). Every one
must land in the optimizer's own tensors, as torch's step leaves them, for many steps. A
learning rate that a schedule changes each step must not make Dynamo trace again.

Dynamo passes a tensor both as itself and as the result of an in-place op on it (``exp_avg_sq``
and ``exp_avg_sq.mul_(beta2)``). thunder then replaces one by the other and drops its
unpacking, and the fusion pass once failed there (``KeyError: 'exp_avg_sq'``) for every
single-tensor ``Adam``, ``AdamW`` and ``SGD``."""

import copy

import pytest
import thunder
import torch

import thunder_fuser
from helpers import plans

ThunderCompiler = pytest.importorskip("thunder.dynamo").ThunderCompiler

STEPS = 20
OPTIMIZERS = {
    "AdamW": lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.1),
    # torch takes a tensor lr with foreach only where capturable (CUDA): a constant lr here
    "AdamW foreach": lambda ps, lr: torch.optim.AdamW(ps, lr=lr.item(), foreach=True),
    "Adam": lambda ps, lr: torch.optim.Adam(ps, lr=lr, weight_decay=0.1),
    "Adam amsgrad": lambda ps, lr: torch.optim.Adam(ps, lr=lr, amsgrad=True),
    "Adam foreach": lambda ps, lr: torch.optim.Adam(ps, lr=lr.item(), foreach=True, weight_decay=0.1),
    "SGD momentum nesterov": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9, nesterov=True,
                                                             weight_decay=0.1),
    "SGD foreach": lambda ps, lr: torch.optim.SGD(ps, lr=lr.item(), momentum=0.9, foreach=True),
}


def _parameters(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((64, 32), (32,), (8, 4, 4))]


def _gradients(params, step: int) -> None:
    g = torch.Generator().manual_seed(1000 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(p.device, p.dtype)  # the generator draws on the CPU


def _assert_same_state(ours, theirs) -> None:
    for (po, so), (pt, st) in zip(ours.state.items(), theirs.state.items()):
        torch.testing.assert_close(po, pt, rtol=1e-5, atol=1e-6)
        assert so.keys() == st.keys()
        for k in so:
            torch.testing.assert_close(so[k], st[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"state {k!r}: {m}")


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_optimizer_step_through_thunderfx_matches_torchs(name, torch_kernels):
    """20 steps, the learning rate (a tensor) changed by a cosine schedule each step: the
    parameters, every state tensor and the step counter as torch's own step leaves them, no
    trace after the first step's, our regions in what thunder ran, and a ``state_dict()``
    round trip that steps on as torch does."""
    torch._dynamo.reset()
    ours, theirs = _parameters(0), _parameters(0)
    opt = OPTIMIZERS[name](ours, torch.tensor(1e-2))
    ref = OPTIMIZERS[name](theirs, torch.tensor(1e-2))
    scheduled = isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    schedules = [torch.optim.lr_scheduler.CosineAnnealingLR(o, STEPS) for o in (opt, ref)] if scheduled else []
    backend = ThunderCompiler(executors=thunder_fuser.executors())
    step = torch.compile(opt.step, backend=backend)
    for i in range(STEPS):
        _gradients(ours, i)
        _gradients(theirs, i)
        step()
        ref.step()
        for s in schedules:
            s.step()
        _assert_same_state(opt, ref)
        if i == 1:
            traced = len(backend.subgraph_infos)
    assert len(backend.subgraph_infos) == traced, "a step after the second traced again"
    fns = [f for info in backend.subgraph_infos for f in info.thunder_compiled_fns]
    assert any(plans(thunder.last_traces(f)[-1]) for f in fns), "no region of ours in the step"
    # thunder takes the whole step: torch's multi-tensor updates (patches/foreach_ops.py) and
    # Dynamo's fma of a single-tensor addcmul_ (patches/dynamo_fma.py) once went to Inductor;
    # only SGD's first step, which makes its momentum buffer with ``detach`` (thunder's own
    # automatic fallback to torch), is split
    given_away = [r.info for info in backend.subgraph_infos for r in info.split_reasons
                  if "automatic torch fallback" not in r.info]
    assert not given_away, given_away

    resumed = OPTIMIZERS[name](ours, torch.tensor(1e-2))
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    step = torch.compile(resumed.step, backend=ThunderCompiler(executors=thunder_fuser.executors()))
    _gradients(ours, STEPS)
    _gradients(theirs, STEPS)
    step()
    ref.step()
    _assert_same_state(resumed, ref)


@pytest.mark.parametrize("foreach", [True, False])
def test_a_compiled_optimizer_step_keeps_no_copy_of_its_tensors(foreach, torch_kernels):
    """Dynamo gives an optimizer's step its parameters and states as attributes of the
    graph, and thunder's splitter deep-copied that graph for its reports: a stale second copy
    of the parameters and both moments, held as long as the step (8.4 GiB on a 1.2B-parameter
    model; ``patches/split_copies.py``). Every tensor the kept graph holds is now the
    optimizer's own."""
    torch._dynamo.reset()
    params = _parameters(0)
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=foreach)
    backend = ThunderCompiler(executors=thunder_fuser.executors())
    step = torch.compile(opt.step, backend=backend)
    for i in range(2):
        _gradients(params, i)
        step()
    own = {id(t) for t in params} | {id(t) for s in opt.state.values() for t in s.values()}
    kept = [t for info in backend.subgraph_infos
            for m in info.original_split_graph_module.split_graph_module.modules()
            for t in (*vars(m).values(), *m._parameters.values(), *m._buffers.values())
            if isinstance(t, torch.Tensor)]
    assert len(kept) >= 3 * len(params)
    assert all(id(t) in own for t in kept), "the compiled step holds a copy of a parameter or a state"


def test_foreach_ops_under_thunder_jit_match_torchs_in_place(torch_kernels):
    """torch's ``_foreach_*`` ops called directly, through ``thunder.jit`` with our executors:
    every list element updated in place as torch updates it, the lists' tensors of three
    shapes, numbers, a 0-d tensor, a list of numbers and a tensor of scalars as operands."""

    def step(ps, gs, ms, lr, scalars):
        torch._foreach_mul_(ms, 0.9)
        torch._foreach_add_(ms, gs, alpha=0.1)
        torch._foreach_lerp_(gs, ms, 0.5)
        denom = torch._foreach_sqrt(torch._foreach_add(torch._foreach_mul(gs, gs), 1e-8))
        torch._foreach_addcdiv_(ps, ms, denom, scalars)
        torch._foreach_mul_(ps, lr)
        torch._foreach_add_(ps, [1.0, 2.0, 3.0])
        return torch._foreach_neg(ps)

    def make():
        g = torch.Generator().manual_seed(0)
        lists = [[torch.randn(s, generator=g) for s in ((16, 8), (8,), (4, 4, 2))] for _ in range(3)]
        return (*lists, torch.tensor(0.5), torch.tensor([-0.1, -0.2, -0.3]))

    ours, theirs = make(), make()
    jstep = thunder.jit(step, executors=thunder_fuser.executors())
    # within fp32 rounding: torch's CPU addcdiv computes (value * b) / c, its CUDA kernel and
    # thunder value * (b / c)
    close = dict(rtol=1e-5, atol=1e-6)
    for _ in range(2):
        got, want = jstep(*ours), step(*theirs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **close)
        for lo, lt in zip(ours[:3], theirs[:3]):
            for a, b in zip(lo, lt):
                torch.testing.assert_close(a, b, **close)
    assert plans(thunder.last_traces(jstep)[-1]), "no region of ours"


JIT_OPTIMIZERS = {
    **OPTIMIZERS,
    "AdamW fused": lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.1, fused=True),
    "Adam amsgrad maximize": lambda ps, lr: torch.optim.Adam(ps, lr=lr, amsgrad=True, maximize=True),
    "SGD": lambda ps, lr: torch.optim.SGD(ps, lr=lr.item()),
    "SGD dampening": lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9, dampening=0.2),
}


@pytest.mark.parametrize("name", JIT_OPTIMIZERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thunder_jit_of_an_optimizer_step_matches_torchs(name, dtype, torch_kernels):
    """``thunder.jit(opt.step, executors=...)`` (``optimizers/jitted_step.py``): two param
    groups (one without weight decay), a cosine schedule changing the learning rate each
    step (a tensor or a number), 20 steps. Every parameter, state tensor and step counter as
    torch's step leaves them (fp32 within its rounding; bf16 within two units in the last
    place of the tensor's largest element), torch's own step only for the
    first (it builds the state; SGD without momentum has none), one trace per group for
    all the other steps, our regions in it, and a ``state_dict()`` round trip that steps on
    as torch does."""
    ours, theirs = ([p.to(dtype) for p in _parameters(0)] for _ in range(2))
    ours, theirs = ([torch.nn.Parameter(p.detach()) for p in ps] for ps in (ours, theirs))

    def groups(ps):
        return [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0}]

    opt, ref = (JIT_OPTIMIZERS[name](groups(ps), torch.tensor(1e-2)) for ps in (ours, theirs))
    schedules = [torch.optim.lr_scheduler.CosineAnnealingLR(o, STEPS) for o in (opt, ref)]
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    # bf16: torch's CPU kernels fuse some multiply-adds (one rounding) and round an alpha to
    # bf16, so an element can drift a unit or two in the last place (of the tensor's largest)
    # over the 20 steps

    def close(a, b, msg=None):
        scale = 1e-6 if dtype == torch.float32 else 1.6e-2 * b.abs().max().item()
        rtol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(a, b, rtol=rtol, atol=scale, msg=msg)

    def same(a, b):
        for (po, so), (pt, st) in zip(a.state.items(), b.state.items()):
            close(po, pt)
            assert so.keys() == st.keys()
            for k in so:
                close(so[k], st[k], msg=lambda m: f"state {k!r}: {m}")
        for po, pt in zip(ours, theirs):
            close(po, pt)

    for i in range(STEPS):
        for ps in (ours, theirs):
            _gradients(ps, i)
        step()
        ref.step()
        for s in schedules:
            s.step()
        same(opt, ref)
    first = 0 if name == "SGD" else 1
    assert (step.eager_steps, step.jitted_steps) == (first, STEPS - first)
    assert thunder.cache_misses(step.update) == 2, "a step traced again"
    assert plans(thunder.last_traces(step)[-1]), "no region of ours in the update"

    resumed = JIT_OPTIMIZERS[name](groups(ours), torch.tensor(1e-2))
    resumed.load_state_dict(copy.deepcopy(opt.state_dict()))
    step = thunder.jit(resumed.step, executors=thunder_fuser.executors())
    for ps in (ours, theirs):
        _gradients(ps, STEPS)
    step()
    ref.step()
    assert step.jitted_steps == 1
    same(resumed, ref)


def test_a_jitted_optimizer_step_runs_hooks_and_closure_and_leaves_what_it_cannot_run_to_torch():
    """The step's pre and post hooks run once a step, a closure's loss comes back, and a
    group whose parameters are at different step counts (one joined late) steps as torch's
    own step, for that call."""
    params = _parameters(0)
    opt, ref = torch.optim.AdamW(params[:2], lr=1e-2), None
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: seen.append("post"))
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    for i in range(2):
        _gradients(params, i)
        assert step(lambda: torch.tensor(3.0)) == 3.0
    assert seen == ["pre", "post"] * 2
    opt.add_param_group({"params": params[2:]})
    clone = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ref = torch.optim.AdamW(clone[:2], lr=1e-2)
    ref.load_state_dict(copy.deepcopy(opt.state_dict()) | {"param_groups": opt.state_dict()["param_groups"][:1]})
    ref.add_param_group({"params": clone[2:]})
    for i in range(2, 4):
        _gradients(params, i)
        _gradients(clone, i)
        step()
        ref.step()
    assert (step.eager_steps, step.jitted_steps) == (2, 2)  # the first, and the late group's first
    for a, b in zip(params, clone):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_jitted_adamw_update_is_one_region_of_few_kernels_writing_each_tensor_once(dtype):
    """The update of all a group's parameters through ``thunder.jit(opt.step)``: one region
    of ours, every parameter and moment written once by ``copy_to_out_``, one launch. thunder lists a written list element twice in an ``update_aliases``
    and groups a bf16 tensor with its own fp32 upcast as a possible view; kept, each ended a
    kernel (36 segments for two bf16 parameters, 807 kernels and 18 GB of temporaries for
    Llama-3.2-1B's AdamW on the H200)."""
    params = [torch.nn.Parameter(p.detach().to(dtype)) for p in _parameters(0)]
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    for i in range(2):
        _gradients(params, i)
        step()
    trace = thunder.last_traces(step)[-1]
    runners = [b._call_ctx[b.sym.name] for b in trace.bound_symbols if b.sym.name.startswith("fuser")]
    assert len(runners) == 1
    assert str(trace).count("copy_to_out_(") == 3 * len(params)
    assert "update_aliases" not in str(trace).split("fuser0(")[0]
    from thunder_fuser.segment.schedule import launch_steps

    assert len(launch_steps(runners[0].segments)) == 1, [s.kind for s in runners[0].segments]


def _skip_a_gradient(opts, params):
    for ps in params:
        ps[1].grad = None


def _write_a_step_count(opts, params):
    for o in opts:
        o.state[o.param_groups[0]["params"][0]]["step"].fill_(100.0)


@pytest.mark.parametrize("disturb", [_skip_a_gradient, _write_a_step_count], ids=["skipped", "written"])
def test_a_step_count_that_moves_apart_keeps_the_step_jitted_and_right(disturb):
    """Step counts that move apart in the third step keep the jitted step as torch's:
    ``skipped``, a parameter without a gradient then is a count behind the others (its group's
    update runs as one call per count, never as torch's step for good); ``written``, a count
    the user writes in place (a restart at another step) is read again from the tensor, past
    the host's mirror of it (``step_counts.py``), and the bias corrections follow it."""
    params, clone = _parameters(0), _parameters(0)
    opt, ref = torch.optim.AdamW(params, lr=1e-2), torch.optim.AdamW(clone, lr=1e-2)
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    for i in range(5):
        _gradients(params, i)
        _gradients(clone, i)
        if i == 2:
            disturb((opt, ref), (params, clone))
        step()
        ref.step()
    assert (step.eager_steps, step.jitted_steps) == (1, 4)
    _assert_same_state(opt, ref)


def test_an_fp64_update_computes_in_fp64():
    """Inside the trace a tensor's dtype is thunder's, which never equals torch's: the
    update's math dtype came out fp32 for fp64 parameters (2e-7 off torch's step)."""
    params, clone = ([torch.nn.Parameter(p.detach().double()) for p in _parameters(0)] for _ in range(2))
    opt, ref = torch.optim.AdamW(params, lr=1e-2), torch.optim.AdamW(clone, lr=1e-2)
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    for i in range(3):
        _gradients(params, i)
        _gradients(clone, i)
        step()
        ref.step()
    for a, b in zip(params, clone):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.cuda
def test_a_jitted_step_queued_ahead_of_a_busy_gpu_reads_each_steps_own_learning_rate():
    """On a GPU a step's scalars (``-lr / bias_correction1``...) travel from pinned buffers
    taken in turns (``jitted_step._Staging``): with the GPU kept busy (a sleep kernel before
    every step), the host queues more steps than there are buffers, each with its own learning
    rate, and every step must read its own numbers, as torch's step on the same gradients."""
    ours, theirs = ([torch.nn.Parameter(p.detach().cuda()) for p in _parameters(0)] for _ in range(2))
    opt, ref = (torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1) for ps in (ours, theirs))
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    grads = []
    for i in range(STEPS):
        _gradients(theirs, i)
        grads.append([g.grad.cuda() for g in theirs])
    for i in range(STEPS):
        for group in (opt.param_groups[0], ref.param_groups[0]):
            group["lr"] = 1e-2 * (i + 1) / STEPS
        torch.cuda._sleep(2_000_000)  # about a millisecond: the host runs ahead
        for p, g in zip(ours, grads[i]):
            p.grad = g.clone()
        step()
    for i in range(STEPS):
        ref.param_groups[0]["lr"] = 1e-2 * (i + 1) / STEPS
        for p, g in zip(theirs, grads[i]):
            p.grad = g.clone()
        ref.step()
    torch.cuda.synchronize()
    assert step.jitted_steps == STEPS - 1
    _assert_same_state(opt, ref)


@pytest.mark.cuda
def test_a_jitted_step_captured_in_a_cuda_graph_is_torchs_and_says_what_it_needs():
    """A graph of the jitted step would replay the numbers of the step it captured (the
    scalars' copies from pinned buffers): inside a capture the step is torch's own, which
    refuses an optimizer that is not ``capturable``, naming it."""
    params = [torch.nn.Parameter(p.detach().cuda()) for p in _parameters(0)]
    opt = torch.optim.AdamW(params, lr=1e-2)
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    for i in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        step()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capturable"):
        with torch.cuda.graph(graph):
            step()


@pytest.mark.parametrize("kind", ["complex", "sparse gradient", "fp64 beside fp32"])
def test_a_group_the_update_cannot_take_steps_as_torchs_own_and_right(kind):
    """What the jitted update leaves to torch (``_group_call``'s checks of every tensor's
    kind): each such step is torch's own, with torch's results."""
    def made():
        ps = [torch.nn.Parameter(p.detach().clone()) for p in _parameters(0)]
        if kind == "complex":
            ps[1] = torch.nn.Parameter(torch.randn(32, dtype=torch.complex64, generator=torch.Generator().manual_seed(3)))
        if kind == "fp64 beside fp32":
            ps[2] = torch.nn.Parameter(ps[2].detach().double())
        return ps

    params, clone = made(), made()
    # torch's Adam refuses sparse gradients; its SGD takes them
    make = (lambda ps: torch.optim.SGD(ps, lr=1e-2)) if kind == "sparse gradient" else (
        lambda ps: torch.optim.Adam(ps, lr=1e-2))
    opt, ref = make(params), make(clone)
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    for i in range(3):
        for ps in (params, clone):
            _gradients(ps, i)
            if kind == "sparse gradient":
                ps[1].grad = ps[1].grad.to_sparse()
        step()
        ref.step()
    assert (step.eager_steps, step.jitted_steps) == (3, 0)
    _assert_same_state(opt, ref)
    for p, q in zip(params, clone):
        torch.testing.assert_close(p, q)


def test_a_jitted_amsgrad_adamw_on_a_conv_model_with_nan_inf_and_missing_gradients_is_torchs():
    """A model the jitted step was not written for (a convolution, a 0-d parameter), AdamW
    with amsgrad and a step schedule, fresh gradients each step (``zero_grad`` to None); in
    one step a NaN and an inf gradient and a parameter without one: every parameter and
    state tensor as torch's step leaves them, NaNs where torch's are."""
    def made():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5))
        return model, torch.nn.Parameter(torch.tensor(0.3))

    (model, extra), (ref_model, ref_extra) = made(), made()
    opt, ref = (torch.optim.AdamW(list(m.parameters()) + [e], lr=1e-2, amsgrad=True)
                for m, e in ((model, extra), (ref_model, ref_extra)))
    schedules = [torch.optim.lr_scheduler.StepLR(o, 2, 0.5) for o in (opt, ref)]
    step = thunder.jit(opt.step, executors=thunder_fuser.executors())
    for i in range(8):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(i))
        for m, e in ((model, extra), (ref_model, ref_extra)):
            m.zero_grad(set_to_none=True)
            e.grad = None
            (m(x).square().mean() + e * 2).backward()
            if i == 5:
                m[0].bias.grad[0] = float("nan")
                m[2].weight.grad[0, 0] = float("inf")
                e.grad = None
        step()
        ref.step()
        for s in schedules:
            s.step()
    assert step.jitted_steps == 7
    for a, b in zip(list(model.parameters()) + [extra], list(ref_model.parameters()) + [ref_extra]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
    for (_, sa), (_, sb) in zip(opt.state.items(), ref.state.items()):
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], rtol=1e-5, atol=1e-6, equal_nan=True)
