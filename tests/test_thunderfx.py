"""The ThunderFX path: ``torch.compile(model, backend=ThunderCompiler(executors=...))``, how
thunder's own benchmark runs models and how it runs what its interpreter cannot trace
(Dynamo's graph breaks: each piece thunder supports goes to ``thunder.jit``, the rest to
Inductor). Training steps of zoo models through our executors against eager, with our
regions in every piece thunder ran and no segment on the reference backend. Without
``patches/thunderfx_graphs.py`` every graph failed on torch 2.6 and later."""

import pytest
import thunder
import torch
import torch.nn.functional as F

import thunder_fuser
from benchmarks.model_zoo import batch, build
from helpers import plans

pytest.importorskip("litgpt")
pytest.importorskip("transformers")
ThunderCompiler = pytest.importorskip("thunder.dynamo").ThunderCompiler


def _compiled(module):
    torch._dynamo.reset()
    backend = ThunderCompiler(executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    return torch.compile(module, backend=backend), backend


def _thunder_functions(backend) -> list:
    return [f for info in backend.subgraph_infos for f in info.thunder_compiled_fns]


def _assert_ours_ran_every_piece(backend) -> None:
    fns = _thunder_functions(backend)
    assert fns, "thunder ran no piece of the graph"
    for f in fns:
        forward = thunder.last_traces(f)[-1]
        assert plans(forward), f"no region of ours in a piece thunder ran:\n{forward}"
        for trace in (forward, *thunder.last_backward_traces(f)[-1:]):
            assert all(not p.decision.fallbacks for p in plans(trace)), [p.decision.fallbacks for p in plans(trace)]


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "hf-Qwen2"])
def test_a_thunderfx_training_step_matches_eager(name, torch_kernels):
    """Two steps (the second runs each region's generated code): the loss and every gradient
    as eager's."""
    ours, ref = build(name, tiny=True), build(name, tiny=True, seed=1)
    ref.module.load_state_dict(ours.module.state_dict())
    idx, targets = batch(ours, 2, 32)
    want = ref.module(idx, targets)
    want.backward()
    step, backend = _compiled(ours.module)
    for _ in range(2):
        for p in ours.module.parameters():
            p.grad = None
        loss = step(idx, targets)
        loss.backward()
        torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
        for (pname, p), q in zip(ours.module.named_parameters(), ref.module.parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{pname}: {m}")
    _assert_ours_ran_every_piece(backend)


def test_a_graph_break_splits_the_step_and_each_piece_runs_ours(torch_kernels):
    """A data-dependent branch breaks Dynamo's graph: both pieces go to thunder.jit, and the
    gradient flows through the break as eager's."""

    def f(x, w):
        h = F.gelu(x @ w)
        if h.sum() > 0:  # a graph break
            return (h * 2.0).softmax(-1).sum()
        return (h - 1.0).softmax(-1).sum()

    x, w = torch.randn(8, 16), torch.randn(16, 32)
    compiled, backend = _compiled(f)
    results = []
    for fn in (f, compiled):
        ww = w.clone().requires_grad_()
        out = fn(x, ww)
        out.backward()
        results.append((out, ww.grad))
    torch.testing.assert_close(results[1], results[0], atol=1e-5, rtol=1e-5)
    assert len(backend.subgraph_infos) == 2
    _assert_ours_ran_every_piece(backend)


def test_a_thunder_pieces_output_that_inductors_piece_reads_has_eagers_strides(torch_kernels):
    """An op thunder does not take (``kthvalue``) splits the graph: a thunder piece hands
    Inductor's piece keys repeated per query head (an expand, then a reshape torch makes by
    copying, row-major), and Inductor's code asserts their strides. Mistral-7B through
    ThunderFX failed so on the GPU: the keys came back in their expanded source's order."""

    def f(qkv):
        b, s, _ = qkv.shape
        k = qkv.view(b, s, 2, 8).transpose(1, 2)
        k = k[:, :, None].expand(b, 2, 2, s, 8).reshape(b, 4, s, 8)
        return torch.kthvalue(k, 2, dim=-1).values * 2

    compiled, backend = _compiled(f)
    x = torch.randn(2, 8, 16)
    torch.testing.assert_close(compiled(x), f(x))
    assert [str(r.reason_type) for info in backend.subgraph_infos for r in info.split_reasons] == [
        "SplitReasonType.MISSING_OP_SUPPORT"]


def test_the_splitter_asks_the_compilers_executors_which_ops_thunder_takes():
    """``patches/splitter_executors.py``: ThunderFX decides which ops thunder takes by running
    their meta and gradient under the executors the compiler was given, not thunder's
    defaults. An executor whose gradient of ``sin`` fails in its meta sends ``sin`` to
    Inductor; thunder's own rule, which the splitter asked before, would have kept it."""
    import thunder.torch as ltorch
    from thunder.extend import OperatorExecutor

    probe = OperatorExecutor("splitter_probe", version="0")
    sin = probe.register_operator("probe_sin", like=ltorch.sin, fn=torch.sin)

    def refuse(a):
        raise ValueError("the probe's gradient of sin has no meta")

    probe.register_implementation(ltorch.sin, sin, checker=lambda a: True, grad_transform=refuse)
    torch._dynamo.reset()
    backend = ThunderCompiler(executors=[probe])
    x = torch.randn(8, requires_grad=True)
    compiled = torch.compile(lambda t: t.sin() * 2, backend=backend)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())
    reasons = [r.exception for info in backend.subgraph_infos for r in info.split_reasons or ()]
    assert reasons == ["the probe's gradient of sin has no meta"], reasons


def _splitter_checks(monkeypatch, fn, *args, executors=None):
    """(thunder's checks the splitter ran, its split reasons, the compiled result, the
    compiler) of ``fn``."""
    from thunder_fuser.patches import splitter_executors

    ran = []
    real = splitter_executors._checked

    def counted(check, symbol, node, *rest):
        ran.append(str(node.target))
        return real(check, symbol, node, *rest)

    monkeypatch.setattr(splitter_executors, "_checked", counted)
    monkeypatch.setattr(splitter_executors, "_passed", {})
    torch._dynamo.reset()
    backend = ThunderCompiler(executors=executors or thunder_fuser.executors())
    out = torch.compile(fn, backend=backend)(*args)
    reasons = [r.exception for info in backend.subgraph_infos for r in info.split_reasons or ()]
    return ran, reasons, out, backend


def test_the_splitter_checks_each_kind_of_node_once(monkeypatch):
    """``patches/splitter_executors.py``: a node alike a node that passed (op, inputs' shapes,
    dtypes, devices, ``requires_grad``, numbers) is not checked again; any difference is."""

    def f(x, y):
        return (x * 2).sin() + (y * 2).sin()

    x, y = torch.randn(4, 6), torch.randn(4, 6)
    ran, _, out, _ = _splitter_checks(monkeypatch, f, x, y)
    torch.testing.assert_close(out, f(x, y))
    assert sorted(ran) == sorted(["<built-in function mul>", "sin", "<built-in function add>"]), ran
    for other in (torch.randn(1, 6), torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, requires_grad=True)):
        ran, _, out, _ = _splitter_checks(monkeypatch, f, x, other)
        torch.testing.assert_close(out, f(x, other))
        assert ran.count("sin") == 2 and ran.count("<built-in function mul>") == 2, (other, ran)
    ran, _, _, _ = _splitter_checks(monkeypatch, lambda a, b: (a * 2).sin() + (b * 3).sin(), x, y)
    assert ran.count("<built-in function mul>") == 2  # another number


def test_a_node_that_fails_the_splitters_check_is_checked_again_and_named(monkeypatch):
    """Only a pass is remembered: each refused node is checked and its own reason given."""
    import thunder.torch as ltorch
    from thunder.extend import OperatorExecutor

    probe = OperatorExecutor("splitter_probe_again", version="0")
    sin = probe.register_operator("probe_again_sin", like=ltorch.sin, fn=torch.sin)

    def refuse(a):
        raise ValueError("no meta")

    probe.register_implementation(ltorch.sin, sin, checker=lambda a: True, grad_transform=refuse)
    x, y = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    ran, reasons, out, _ = _splitter_checks(monkeypatch, lambda a, b: a.sin() * 2 + b.sin() * 2, x, y,
                                            executors=[probe])
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())
    assert ran.count("sin") == 2 and reasons == ["no meta", "no meta"], (ran, reasons)


def test_a_model_splits_as_it_split_with_every_node_checked(monkeypatch):
    """A model the memory was not written for (transformers' GPT-2, tiny, one layer: its
    Conv1D's addmm, tied head and loss): the same pieces, split reasons and loss with each
    kind of node checked once as with every node checked, in fewer checks."""
    from thunder_fuser.patches import splitter_executors

    built = build("hf-GPT2", layers=1, tiny=True)
    idx, targets = batch(built, 2, 16)
    got = {}
    for remembered in (0, splitter_executors._MAX_PASSED):
        monkeypatch.setattr(splitter_executors, "_MAX_PASSED", remembered)
        ran, _, loss, backend = _splitter_checks(monkeypatch, built.module, idx, targets)
        infos = backend.subgraph_infos
        got[remembered] = (len(ran), [str(i.split_graph_module.graph) for i in infos],
                           [(str(r.reason_type), r.info) for i in infos for r in i.split_reasons or ()], loss.detach())
    (every, *every_split), (once, *once_split) = got.values()
    assert once < every and once_split[:2] == every_split[:2], (once, every)
    torch.testing.assert_close(once_split[2], every_split[2])
    torch.testing.assert_close(once_split[2], built.module(idx, targets).detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nodes_alike_but_for_what_the_check_ignores_keep_eagers_answer(monkeypatch, dtype):
    """Break the splitter's memory: the same op over a transposed (strided) input, a 0-d
    tensor, one tensor twice (aliased), an in-place update of an input, and numbers that are
    NaN, inf or huge; outputs, the updated input and gradients against eager."""
    def f(x, t, z, buf, w):
        a = (x * 2).sin() + (t * 2).sin()  # t: x's shape, transposed storage
        b = (z * 2).sin() + (x * x)  # 0-d, and one tensor twice
        buf.add_(a)  # an input updated in place
        c = (w * float("nan")).nan_to_num(0.5) + (w * float("inf")).clamp(-3, 3) + (w * 1e30) * 1e-30 + w * 2
        return a.sum() + b.sum() + c.sum() + buf.sum()

    def inputs():
        g = torch.Generator().manual_seed(3)
        x = torch.randn(4, 6, generator=g).to(dtype).requires_grad_()
        t = torch.randn(6, 4, generator=g).to(dtype).t().detach().requires_grad_()
        z = torch.randn((), generator=g).to(dtype).requires_grad_()
        w = torch.randn(4, 6, generator=g).to(dtype).requires_grad_()  # w's gradient: NaN, as eager's
        return x, t, z, torch.zeros(4, 6, dtype=dtype), w

    want_in, got_in = inputs(), inputs()
    want = f(*want_in)
    want.backward()
    _, _, got, _ = _splitter_checks(monkeypatch, f, *got_in)
    got.backward()
    tol = dict(atol=1e-2, rtol=1e-2) if dtype is torch.bfloat16 else {}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(got_in[3], want_in[3], **tol)  # the in-place update landed
    for i in (0, 1, 2, 4):
        torch.testing.assert_close(got_in[i].grad, want_in[i].grad, equal_nan=i == 4, **tol)


@pytest.mark.cuda
def test_attention_with_a_batch_broadcast_mask_stays_in_thunder_and_its_gradients_match_eager():
    """litgpt's sliding-window layers (Mistral, Phi-3) hand SDPA a ``(1, 1, T, T)`` mask for a
    batch of 2. thunder's ``sdpa_ex`` gradient rule refuses a mask broadcast over the batch,
    and the splitter asked it rather than our executors: the attention went to an Inductor
    piece. With the compiler's own executors asked, our attention executor (cuDNN) takes it,
    and its gradients are eager's (passed on the H200)."""

    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2) * 2

    t = 256
    q, k, v = (torch.randn(2, 8, t, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = torch.full((t, t), float("-inf"), device="cuda", dtype=torch.bfloat16).triu(1).view(1, 1, t, t)
    g = torch.randn(2, t, 8, 128, device="cuda", dtype=torch.bfloat16)
    f(q, k, v, mask).backward(g)
    want = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    compiled, backend = _compiled(f)
    compiled(q, k, v, mask).backward(g)
    assert not [r for info in backend.subgraph_infos for r in info.split_reasons or ()]
    for x, w in zip((q, k, v), want):
        torch.testing.assert_close(x.grad, w, atol=2e-2, rtol=2e-2)


def test_the_splitter_reads_the_calls_numbers_when_it_asks_our_attention_executor():
    """The splitter asks with a call's numbers as static number proxies (litgpt passes
    ``dropout_p=0.0`` and ``is_causal=False`` explicitly): our attention executor reads them
    as numbers. It refused every such call before, so on a GPU ``sdpa_ex`` was asked, its
    gradient refused the batch-broadcast mask and the attention went to an Inductor piece
    (where torch 2.11's cuDNN backward then gave wrong gradients: the test below). A dynamic
    number it cannot read is refused."""
    import thunder.core.dtypes as dtypes
    from thunder.core.proxies import CONSTRAINT, FloatProxy, IntegerProxy, TensorProxy
    from thunder.core.trace import TraceCtx, tracectx
    from thunder.core.devices import cpu

    from thunder_fuser.attention import _checker

    with tracectx(TraceCtx()):
        q = TensorProxy(shape=(2, 8, 16, 64), device=cpu, dtype=dtypes.float32)
        mask = TensorProxy(shape=(1, 1, 16, 16), device=cpu, dtype=dtypes.float32)
        static = CONSTRAINT.STATIC
        assert _checker(q, q, q, mask, FloatProxy(value=0.0, constraint=static), IntegerProxy(value=False, constraint=static),
                        scale=FloatProxy(value=0.125, constraint=static))
        assert not _checker(q, q, q, mask, FloatProxy(value=0.1, constraint=static), False)
        assert not _checker(q, q, q, mask, 0.0, IntegerProxy(value=False, constraint=CONSTRAINT.DYNAMIC))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["Mistral-7B-v0.1", "Phi-3-mini-4k-instruct"])
def test_a_sliding_window_litgpt_layer_trains_through_thunderfx_on_cuda(name):
    """litgpt's sliding-window layers (Mistral, Phi-3) build a ``(1, 1, T, T)`` mask row by row
    and hand it to SDPA with explicit ``dropout_p`` and ``is_causal``. Through ThunderFX on
    the H200 the gradients of everything before the attention came back ~130% off: the
    splitter refused the attention to our executor (it read the numbers as proxies), it went
    to an Inductor piece, and torch 2.11's cuDNN backward, which caches its plan without the
    output gradient's strides, ran Inductor's contiguous gradient with the plan eager had
    built for a transposed one. Now it stays in thunder and the gradients are fp32's."""
    from litgpt import GPT, Config
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    t, heads, groups, hs = 256, 8, (2 if "Mistral" in name else 8), 128 if "Mistral" in name else 96
    cfg = Config.from_name(name, n_layer=1, n_embd=heads * hs, n_head=heads, n_query_groups=groups, head_size=hs,
                           intermediate_size=2048, padded_vocab_size=4096, vocab_size=4096, block_size=t)
    model = GPT(cfg).to("cuda", torch.bfloat16)
    idx = torch.randint(0, 4096, (2, t), device="cuda")
    model(idx).float().sum().backward()  # eager first, as a user would: its plans are cached
    model.zero_grad(set_to_none=True)
    wide = GPT(cfg).to("cuda", torch.float32)
    wide.load_state_dict({n: p.float() for n, p in model.state_dict().items()})
    with sdpa_kernel([SDPBackend.MATH]):
        wide(idx).sum().backward()
    want = {n: p.grad for n, p in wide.named_parameters()}
    compiled, backend = _compiled(model)
    compiled(idx).float().sum().backward()
    reasons = [str(r.info) for info in backend.subgraph_infos for r in info.split_reasons or ()]
    assert not [r for r in reasons if "scaled_dot_product_attention" in r], reasons
    for n, p in model.named_parameters():
        err = ((p.grad.float() - want[n]).norm() / want[n].norm()).item()
        assert err < 3e-2, f"{n}: {err:.2e}"
