"""Decoding with a KV cache (issue 33), without CUDA graphs: litgpt's ``GPT`` with its own KV
cache, a prefill and several one-token steps through thunder + fuser, the logits and every
layer's cache against eager's after every step; the cache moved to new tensors midway; a
counter updated in place each step. On the CPU the kernel segments run their lowered
programs; the ``cuda`` test runs the generated kernels."""

from __future__ import annotations

import pytest
import thunder
import torch

import thunder_fuser

litgpt = pytest.importorskip("litgpt")

TINY = dict(n_layer=2, n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=128,
            padded_vocab_size=512, vocab_size=500, block_size=64)


def _models(name: str, device, dtype):
    cfg = litgpt.Config.from_name(name, **TINY)
    torch.manual_seed(0)
    ours, ref = litgpt.GPT(cfg), litgpt.GPT(cfg)
    ref.load_state_dict(ours.state_dict())
    for m in (ours, ref):
        m.to(device=device, dtype=dtype).eval()
        m.set_kv_cache(batch_size=1, max_seq_length=32, device=device, dtype=dtype)
    return ours, ref


def _caches(model) -> list[torch.Tensor]:
    return [t for block in model.transformer.h for t in (block.attn.kv_cache.k, block.attn.kv_cache.v)]


def _decode_matches_eager(name: str, device: str, dtype, tol: float, move_cache_at: int | None = None,
                          graphed: bool = False, move_with: str = "module", backend=None):
    """Prefill and seven steps, logits and every layer's cache against eager's after each;
    at ``move_cache_at`` the cache moves to new tensors: assigned to the module's buffers
    (``move_with="module"``, which thunder 0.2.6 does not see) or through thunder's module
    (``"thunder"``: ``set_buffer``, how a ``thunder.jit`` module's buffers are replaced)."""
    ours, ref = _models(name, device, dtype)
    tm = thunder.jit(ours, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    jm = thunder_fuser.graphed(tm, backend=backend) if graphed else tm
    names = [f"transformer.h.{i}.attn.kv_cache.{kv}" for i in range(len(ours.transformer.h)) for kv in "kv"]
    caches = (lambda: [tm.get_buffer(n) for n in names]) if move_with == "thunder" else (lambda: _caches(ours))
    prompt = torch.randint(0, 500, (1, 5), device=device)
    with torch.no_grad():
        got, want = jm(prompt, input_pos=torch.arange(5, device=device)), ref(prompt, input_pos=torch.arange(5, device=device))
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
        token = want[:, -1:].argmax(-1)
        for pos in range(5, 12):
            if pos == move_cache_at and move_with == "thunder":
                for n in names:
                    tm.set_buffer(n, tm.get_buffer(n).clone())
            elif pos == move_cache_at:  # the caller hands the model new cache tensors
                for block in ours.transformer.h:
                    block.attn.kv_cache.k = block.attn.kv_cache.k.clone()
                    block.attn.kv_cache.v = block.attn.kv_cache.v.clone()
            at = torch.tensor([pos], device=device)
            got, want = jm(token, input_pos=at), ref(token, input_pos=at)
            torch.testing.assert_close(got, want, atol=tol, rtol=tol, msg=lambda m: f"logits at {pos}: {m}")
            for i, (c, w) in enumerate(zip(caches(), _caches(ref))):
                torch.testing.assert_close(c, w, atol=tol, rtol=tol, msg=lambda m: f"cache {i} after {pos}: {m}")
            token = want.argmax(-1)
    return jm


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "pythia-410m"])
def test_litgpt_decode_keeps_the_kv_cache_right_every_step(name, torch_kernels):
    _decode_matches_eager(name, "cpu", torch.float32, 1e-5)


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="thunder 0.2.6 keeps the module's buffers as they were at jit time, with any executors")
def test_litgpt_decode_writes_into_a_cache_moved_midway(torch_kernels):
    """A module's cache buffers replaced between steps: thunder's ThunderModule holds its own
    references to the buffers it traced, so later steps still write the old tensors; its
    default executors do the same (a cache passed as an argument moves fine:
    ``test_a_decode_step_writes_into_whatever_cache_it_is_given``)."""
    _decode_matches_eager("Llama-3.2-1B", "cpu", torch.float32, 1e-5, move_cache_at=8)


@pytest.mark.parametrize("graphed", [False, True], ids=["as it is", "graphed"])
def test_litgpt_decode_writes_into_a_cache_moved_through_thunders_module(graphed, torch_kernels):
    """The cache moved midway the way thunder's module takes new buffers (``set_buffer``):
    every later step writes the new tensors, also replayed as graphs (on the CPU through
    ``test_graphs.py``'s recording stand-in), where the move captures a new graph."""
    from test_graphs import RecordingGraphs

    backend = RecordingGraphs()
    step = _decode_matches_eager("Llama-3.2-1B", "cpu", torch.float32, 1e-5, move_cache_at=8, graphed=graphed,
                                 move_with="thunder", backend=backend)
    if graphed:
        assert step.captures == 2 and backend.replays == 6 and not step.ungraphed, (step.captures, step.ungraphed)


def _decode_step(x, k_cache, v_cache, pos, wq, wk, wv):
    """The seed's KV-cache step as a function of its cache: project one token, write its key
    and value into the cache in place (``index_copy_``), attend over the cache."""
    q = (x @ wq).view(1, 1, 4, 16).transpose(1, 2)
    k = (x @ wk).view(1, 1, 4, 16).transpose(1, 2)
    v = (x @ wv).view(1, 1, 4, 16).transpose(1, 2)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    y = torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache)  # the unwritten rest is zeros
    return y.transpose(1, 2).reshape(1, 1, 64)


def test_a_decode_step_writes_into_whatever_cache_it_is_given(torch_kernels):
    """The cache passed as an argument, moved to new tensors midway and once to a cache at
    another offset of a larger buffer: every step writes the cache it is given, and nothing
    else."""
    torch.manual_seed(0)
    ws = [torch.randn(64, 64) / 8 for _ in range(3)]
    jstep = thunder.jit(_decode_step, executors=thunder_fuser.executors())
    ours = [torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16)]
    theirs = [c.clone() for c in ours]
    for pos in range(10):
        if pos == 4:  # new tensors
            ours = [c.clone() for c in ours]
        if pos == 7:  # a view at an offset of a larger buffer
            big = torch.zeros(2, 4, 16, 16)
            big[1] = ours[0][0]
            ours = [big[1:], ours[1].clone()]
        old = [c.clone() for c in ours]
        x = torch.randn(1, 1, 64)
        at = torch.tensor([pos])
        got, want = jstep(x, *ours, at, *ws), _decode_step(x, *theirs, at, *ws)
        torch.testing.assert_close(got, want)
        for c, w, o in zip(ours, theirs, old):
            torch.testing.assert_close(c, w)
            assert torch.equal(c[:, :, pos + 1:], o[:, :, pos + 1:])  # nothing past the step written
        if pos >= 7:
            assert torch.equal(big[0], torch.zeros(4, 16, 16))  # the rest of the buffer untouched


def test_a_counter_updated_in_place_each_step(torch_kernels):
    def step(x, counter, cache, pos):
        counter.add_(1)
        cache.index_copy_(0, pos, x * counter)
        return cache.sum(0) / counter

    jstep = thunder.jit(step, executors=[thunder_fuser.fuser_ex])
    ours = (torch.zeros(()), torch.zeros(6, 4))
    theirs = (torch.zeros(()), torch.zeros(6, 4))
    for i in range(6):
        x = torch.randn(1, 4)
        got, want = jstep(x, *ours, torch.tensor([i])), step(x, *theirs, torch.tensor([i]))
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(ours, theirs)


@pytest.mark.cuda
@pytest.mark.parametrize("graphed", [False, True], ids=["kernels", "graphed"])
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "pythia-410m"])
def test_litgpt_decode_on_kernels(name, graphed):
    """On the GPU, on our kernels, and replayed as CUDA graphs: logits and every layer's cache
    against eager's after every step (the prefill and two steps run as they are, five replay)."""
    step = _decode_matches_eager(name, "cuda", torch.bfloat16, 3e-2, graphed=graphed)
    if graphed:
        assert step.captures >= 1 and not step.ungraphed, (step.captures, step.ungraphed)


def test_a_cache_write_runs_in_place_as_the_program_wrote_it(torch_kernels):
    """thunder functionalizes ``cache.index_copy_`` into an out-of-place copy of the whole
    cache and a copy back; the fusion pass writes it in place again
    (``passes/writes_in_place.py``): one ``fuser_index_copy_`` per cache, no copy of a cache."""
    torch.manual_seed(0)
    ws = [torch.randn(64, 64) / 8 for _ in range(3)]
    jstep = thunder.jit(_decode_step, executors=thunder_fuser.executors())
    caches = [torch.zeros(1, 4, 16, 16), torch.zeros(1, 4, 16, 16)]
    x, at = torch.randn(1, 1, 64), torch.tensor([3])
    jstep(x, *caches, at, *ws)
    trace = str(thunder.last_traces(jstep)[-1])
    assert trace.count("fuser_index_copy_(") == 2
    assert "torch.index_copy(" not in trace and "prims.copy_(" not in trace


def test_an_index_copy_read_elsewhere_stays_a_copy():
    """The result of an out-of-place ``index_copy`` that something besides the copy back
    reads keeps its own memory: the cache's old value is still the copy's base."""

    def f(cache, pos, src):
        r = cache.index_copy(0, pos, src)
        cache.copy_(r)
        return r * 2

    jf = thunder.jit(f, executors=thunder_fuser.executors())
    ours, theirs = torch.randn(6, 4), None
    theirs = ours.clone()
    src, pos = torch.randn(2, 4), torch.tensor([1, 4])
    torch.testing.assert_close(jf(ours, pos, src), f(theirs, pos, src))
    torch.testing.assert_close(ours, theirs)
    assert "fuser_index_copy_" not in str(thunder.last_traces(jf)[-1])


def test_a_source_overlapping_its_cache_is_refused_as_eager_refuses_it():
    def f(cache, pos):
        cache.index_copy_(0, pos, cache[2:4])
        return cache * 1

    pos = torch.tensor([0, 1])
    with pytest.raises(RuntimeError) as eager:
        f(torch.randn(6, 4), pos)
    with pytest.raises(RuntimeError) as ours:
        thunder.jit(f, executors=thunder_fuser.executors())(torch.randn(6, 4), pos)
    assert str(ours.value) == str(eager.value)


def test_a_transformers_model_decodes_with_its_static_cache(torch_kernels):
    """transformers' ``StaticCache`` (a preallocated cache written by ``index_copy_``) traces
    in thunder 0.2.6, unlike its default ``DynamicCache`` (``test_models.py``): a prefill and
    six one-token steps of its Llama, logits and every layer's cache against eager's after
    each step, each cache write in place (``passes/writes_in_place.py``); midway the module is
    handed a new cache (``HFStaticDecode.move_cache``), which the later steps write."""
    pytest.importorskip("transformers")
    from benchmarks.decode import _caches, _model

    ours, _ = _model("hf-Llama", 2, torch.device("cpu"), torch.float32)
    theirs, _ = _model("hf-Llama", 2, torch.device("cpu"), torch.float32, state=ours.model.state_dict())
    jm = thunder.jit(ours, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    with torch.no_grad():
        prompt = torch.randint(0, 500, (1, 5))
        torch.testing.assert_close(jm(prompt, torch.arange(5)), theirs(prompt, torch.arange(5)))
        for pos in range(5, 11):
            if pos == 8:
                ours.move_cache()
            token, at = torch.randint(0, 500, (1, 1)), torch.tensor([pos])
            torch.testing.assert_close(jm(token, at), theirs(token, at))
            for c, w in zip(_caches(ours), _caches(theirs)):
                torch.testing.assert_close(c, w)
    assert _caches(ours)[0][:, :, :11].abs().sum() > 0  # the cache the module holds was written
    assert str(thunder.last_traces(jm)[-1]).count("fuser_index_copy_(") == 4  # 2 layers, key and value


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["thunder+fuser", "thunder+fuser graphed"])
def test_a_transformers_model_decodes_on_kernels(kind):
    """The same on the GPU in bf16, on our kernels, and replayed as CUDA graphs
    (``thunder_fuser.graphed``): logits and every layer's cache against eager's after the
    prefill and after each of eight steps, the module handed a new cache midway (a graph
    replayed over the old cache would lose the later writes: ``cudagraphs/held_tensors.py``)."""
    pytest.importorskip("transformers")
    from benchmarks.contenders import wrap
    from benchmarks.decode import _caches, _model

    cuda = torch.device("cuda")
    ours, _ = _model("hf-Llama", 2, cuda, torch.bfloat16, tiny=True)
    theirs, _ = _model("hf-Llama", 2, cuda, torch.bfloat16, state=ours.model.state_dict(), tiny=True)
    fn = wrap(kind, ours)

    def near(a, b, what):
        err = ((a.float() - b.float()).norm() / (b.float().norm() + 1e-12)).item()
        assert err < 2e-2, f"{what}: relative error {err:.3g}"

    with torch.no_grad():
        prompt = torch.randint(0, 500, (1, 5), device=cuda)
        near(fn(prompt, torch.arange(5, device=cuda)), theirs(prompt, torch.arange(5, device=cuda)), "prefill")
        for pos in range(5, 13):
            if pos == 9:
                ours.move_cache()
                torch.cuda.empty_cache()  # the old cache's memory is gone, not merely unused
            token, at = torch.randint(0, 500, (1, 1), device=cuda), torch.tensor([pos], device=cuda)
            near(fn(token, at), theirs(token, at), f"logits at {pos}")
            for i, (c, w) in enumerate(zip(_caches(ours), _caches(theirs))):
                near(c, w, f"cache {i} after {pos}")
    if kind.endswith("graphed"):
        assert fn.captures >= 2 and not fn.ungraphed, (fn.captures, fn.ungraphed)
