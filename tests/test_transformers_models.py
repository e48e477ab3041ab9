"""transformers' causal LMs, built from configs at tiny sizes, trained with our executors
under whichever transformers is installed: 4.52.4 from the test extra, and the newest 5.x
through the README's second test command (``.ci/run`` runs both).

ThunderFX (``torch.compile(model, backend=ThunderCompiler(...))``) trains every one, with the
KV cache argument at its default and off. ``thunder.jit`` traces the model itself only
under 4.52.4 with ``use_cache=False``: its interpreter fails on 5.x's config views and on
4.52.4's ``DynamicCache``; those cases are strict xfails, so a thunder that learns them is
noticed."""

import pytest
import torch

import thunder_fuser

transformers = pytest.importorskip("transformers")
import thunder  # noqa: E402

from helpers import plans  # noqa: E402

SIZES = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, num_hidden_layers=2, pad_token_id=0)
MODELS = {"Llama": {}, "Qwen2": {}, "Mistral": {}, "Gemma2": {"head_dim": 16}, "Phi3": {}}
CACHE = {"cache argument at its default": {}, "use_cache=False": {"use_cache": False}}
VERSION = tuple(int(p) for p in transformers.__version__.split(".")[:2])


def _models(name: str):
    config = getattr(transformers, f"{name}Config")(**SIZES, **MODELS[name])
    cls = getattr(transformers, f"{name}ForCausalLM")
    torch.manual_seed(0)
    ours, ref = cls(config), cls(config)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _step_matches_eager(name: str, cache: str, wrap) -> object:
    """One training step through ``wrap(model)``: the loss and every gradient as eager's."""
    ours, ref = _models(name)
    idx = torch.randint(0, SIZES["vocab_size"], (2, 32), generator=torch.Generator().manual_seed(1))
    want = ref(input_ids=idx, labels=idx, **CACHE[cache]).loss
    want.backward()
    step = wrap(ours)
    loss = step(input_ids=idx, labels=idx, **CACHE[cache]).loss
    loss.backward()
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    for (pname, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=lambda m: f"{pname}: {m}")
    return step


@pytest.mark.parametrize("cache", list(CACHE))
@pytest.mark.parametrize("name", list(MODELS) if VERSION >= (5, 0) else ["Llama"])
def test_thunderfx_trains_a_transformers_model_as_eager(name, cache, torch_kernels):
    """Every model under 5.x; Llama under 4.52.4 (``test_models.py`` steps the others there)."""
    from thunder.dynamo import ThunderCompiler

    torch._dynamo.reset()
    backend = ThunderCompiler(executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    _step_matches_eager(name, cache, lambda m: torch.compile(m, backend=backend))
    pieces = [f for info in backend.subgraph_infos for f in info.thunder_compiled_fns]
    # (a piece of only matmuls or an embedding has nothing for us)
    assert any(plans(thunder.last_traces(f)[-1]) for f in pieces), "no region of ours in any piece thunder ran"


@pytest.mark.parametrize("cache", list(CACHE))
def test_thunder_jit_traces_transformers_llama_only_under_4_52_without_the_cache(cache, torch_kernels, request):
    if VERSION >= (5, 0) or cache != "use_cache=False":
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="thunder 0.2.6's interpreter: transformers 5.x's config views "
            "('_PerLayerConfigView' object has no attribute '_config'), 4.52.4's DynamicCache"))
    _step_matches_eager("Llama", cache, lambda m: thunder.jit(m, executors=thunder_fuser.executors()))
