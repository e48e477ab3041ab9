"""Real client code to step: litgpt's ``GPT`` with its own configs and Hugging Face
``transformers`` models built from a config (no weights are downloaded), each with its loss
in one module, as a training step jits them.

Every model here is somebody else's code: litgpt's Llama-3.2-1B (grouped-query attention,
RoPE, its 128256 vocabulary), pythia-410m (GPT-NeoX: parallel residual, partial rotary,
LayerNorm with bias), gemma-2b (an embedding scale, GELU-gated MLP, 256000 vocabulary), and
transformers' Llama and Qwen2 (transformers 4.52.4, without its KV cache: the newest that
thunder 0.2.6 traces, ``tests/test_transformers_models.py``). ``MORE`` (litgpt's phi-2, transformers'
GPT-2) the tests step too. ``layers`` cuts the depth so one H100 holds every contender;
``tiny`` cuts every size, for the CPU tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

LITGPT = ("Llama-3.2-1B", "pythia-410m", "gemma-2b")
HF = ("hf-Llama", "hf-Qwen2")
MODELS = LITGPT + HF  # the benchmark's
# the block shapes issue 30 also names, stepped by the tests (not yet benchmarked): litgpt's
# phi-2 (a parallel block with partial rotary, LayerNorm with bias, tanh GELU) and
# transformers' GPT-2 (learned positions, Conv1D projections, tanh GELU, a tied head)
MORE_LITGPT = ("phi-2",)
MORE_HF = ("hf-GPT2",)
MORE = MORE_LITGPT + MORE_HF
# shapes too large for one GPU at full depth, for the sharded benchmark (benchmarks.distributed)
SHARDED_LITGPT = ("Llama-3.1-8B", "Llama-3.1-70B")
# the zoo's (``benchmarks.zoo``) other litgpt configs: what users train beside the above
ZOO_LITGPT = ("Llama-3.2-3B", "Mistral-7B-v0.1", "Phi-3-mini-4k-instruct", "Gemma-2-2b", "Qwen2.5-1.5B",
              "OLMo-1B-hf", "falcon-7b", "stablelm-3b-4e1t", "pythia-1b")
# and transformers' (4.52.4) Mistral, Phi3 and Gemma2 (its logits soft-capped)
ZOO_HF = ("hf-Mistral", "hf-Phi3", "hf-Gemma2")
# a vision transformer: transformers' ViT-Base/16 at 224 pixels (a conv's patches, a class
# token, attention without a mask, LayerNorm, GELU, a classifier's loss over 1000 labels)
VISION = ("hf-ViT",)
TINY_VIT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, image_size=32, patch_size=8, num_labels=10)

# tiny sizes for the CPU (every name's structure, a few thousand parameters)
TINY_LITGPT = dict(n_embd=64, n_head=4, intermediate_size=128, padded_vocab_size=512, vocab_size=500, block_size=64,
                   head_size=16)
TINY_GROUPS = {"Llama-3.2-1B": 2, "pythia-410m": 4, "gemma-2b": 2, "phi-2": 4, "Llama-3.1-8B": 2, "Llama-3.1-70B": 2,
               "Llama-3.2-3B": 2, "Mistral-7B-v0.1": 2, "Phi-3-mini-4k-instruct": 4, "Gemma-2-2b": 2,
               "Qwen2.5-1.5B": 2, "OLMo-1B-hf": 4, "falcon-7b": 1, "stablelm-3b-4e1t": 4, "pythia-1b": 4}
TINY_MAX_SEQ = TINY_LITGPT["block_size"]  # the longest sequence every tiny model takes
TINY_HF = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=128)
# Hugging Face models at Llama-3.2-1B's and Qwen2-0.5B's sizes
HF_SIZES = {
    "hf-Llama": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                     num_key_value_heads=8, max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=True),
    "hf-Qwen2": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                     num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
    "hf-GPT2": dict(vocab_size=50304, hidden_size=768, num_attention_heads=12, max_position_embeddings=1024),
    # Mistral-7B's, Phi-3-mini's and gemma-2-2b's sizes
    "hf-Mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                       num_key_value_heads=8, max_position_embeddings=4096),
    "hf-Phi3": dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_attention_heads=32,
                    num_key_value_heads=32, max_position_embeddings=4096),
    "hf-Gemma2": dict(vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=256, max_position_embeddings=8192),
}
# what a tiny model of these needs beside ``TINY_HF`` (Gemma2's heads are 256 wide by default)
TINY_HF_MORE = {"hf-Gemma2": dict(head_dim=16), "hf-Phi3": dict(pad_token_id=0)}
# transformers applies Gemma2's attention soft-capping only in its eager attention
HF_ATTENTION = {"hf-Gemma2": "eager"}
# GPT-2 without dropout (litgpt's models have none: steps compare with eager's), its MLP's
# width its own default (4x), keys its config maps (``n_embd``, ``n_head``, ``n_positions``)
TINY_GPT2 = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, max_position_embeddings=128)
NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


class LitGPTWithLoss(torch.nn.Module):
    """litgpt's GPT and its loss in one module: the loss is part of the jitted step."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        logits = self.model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class HFWithLoss(torch.nn.Module):
    """A transformers causal LM; its own loss (shifted labels, logits upcast to fp32)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return self.model(input_ids=idx, labels=targets).loss


class HFImageWithLoss(torch.nn.Module):
    """A transformers image classifier and the loss a training loop takes of its logits:
    (pixels, labels) -> loss. (Its own loss looks itself up on each call through a
    ``warning_once`` cache, which thunder's interpreter cannot trace a write into.)"""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels, labels):
        return F.cross_entropy(self.model(pixel_values=pixels).logits, labels)


@dataclass
class Built:
    name: str
    module: torch.nn.Module  # (idx, targets) -> loss; an image model's (pixels, labels) -> loss
    config: dict  # what the results record of it
    vocab: int  # token ids, or an image model's labels
    image: tuple[int, int] | None = None  # an image model's (pixels a side, pixels a patch side)
    max_seq: int | None = None  # the longest sequence its positions take (GPT-2: 1024)


def build(name: str, layers: int = 2, tiny: bool = False, device="cpu", dtype=torch.float32, seed: int = 0,
          made_on_device: bool = False, longest: int | None = None) -> Built:
    """The model ``name`` on ``device`` in ``dtype``: made on the CPU in fp32, then converted
    (the same weights on every device), or with ``made_on_device`` made on ``device`` in
    ``dtype`` (a model of 19e9 parameters never exists in fp32 on the host; other weights).
    ``longest``: the longest sequence it will step, if known (``litgpt_config``)."""
    torch.manual_seed(seed)
    if made_on_device and device is not None:
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                return build(name, layers, tiny, None, dtype, seed, longest=longest)  # None: where it is made
        finally:
            torch.set_default_dtype(default)
    if name in LITGPT + MORE_LITGPT + SHARDED_LITGPT + ZOO_LITGPT:
        import litgpt

        cfg = litgpt_config(name, layers, tiny, longest)
        module = LitGPTWithLoss(litgpt.GPT(cfg))
        config = dict(source="litgpt", n_layer=cfg.n_layer, n_embd=cfg.n_embd, n_head=cfg.n_head,
                      n_query_groups=cfg.n_query_groups, intermediate_size=cfg.intermediate_size,
                      vocab=cfg.padded_vocab_size, rotary_percentage=cfg.rotary_percentage,
                      parallel_residual=cfg.parallel_residual)
        window = litgpt.Config.from_name(name).sliding_window_size
        if window is not None and cfg.sliding_window_size is None:
            config["sliding_window"] = f"off: {window} tokens mask nothing in sequences of at most {longest}"
        vocab, max_seq = cfg.vocab_size, cfg.block_size
    elif name in HF + MORE_HF + ZOO_HF:
        import transformers

        model, sizes = hf_causal_lm(name, layers, tiny, use_cache=False)
        module = HFWithLoss(model)
        config = dict(source=f"transformers {transformers.__version__}", num_hidden_layers=layers, **sizes)
        vocab, max_seq = sizes["vocab_size"], model.config.max_position_embeddings
    elif name in VISION:
        import transformers

        sizes = TINY_VIT if tiny else dict(num_labels=1000)
        cfg = transformers.ViTConfig(num_hidden_layers=layers, attn_implementation="sdpa", **sizes)
        module = HFImageWithLoss(transformers.ViTForImageClassification(cfg))
        config = dict(source=f"transformers {transformers.__version__}", num_hidden_layers=layers,
                      hidden_size=cfg.hidden_size, image_size=cfg.image_size, patch_size=cfg.patch_size,
                      num_labels=cfg.num_labels)
        return Built(name, module.to(dtype=dtype) if device is None else module.to(device=device, dtype=dtype),
                     config, cfg.num_labels, (cfg.image_size, cfg.patch_size))
    else:
        raise ValueError(f"unknown model {name!r}; one of "
                         f"{MODELS + MORE + SHARDED_LITGPT + ZOO_LITGPT + ZOO_HF + VISION}")
    return Built(name, module.to(dtype=dtype) if device is None else module.to(device=device, dtype=dtype), config,
                 vocab, max_seq=max_seq)


def litgpt_config(name: str, layers: int, tiny: bool, longest: int | None = None):
    """litgpt's config of ``name`` at ``layers`` layers, with ``tiny``: the CPU's tiny widths.

    A sliding window at least ``longest`` tokens long (Mistral-7B's 4096, Phi-3-mini's 2048,
    stepped at 2048) masks nothing the causal mask does not, and is left off: litgpt builds
    its mask in a Python loop of one slice assignment per token, in every layer's forward,
    which every compiler traces op by op (torch.compile's first fwd+bwd of a 2-layer tiny
    Mistral on the CPU: 42 s at 64 tokens, 177 s at 512; at 2048 on the H100 it had not
    ended after 8 minutes). Off, attention is causal, the same numbers."""
    import litgpt

    extra = dict(TINY_LITGPT, n_query_groups=TINY_GROUPS[name]) if tiny else {}
    cfg = litgpt.Config.from_name(name, n_layer=layers, **extra)
    if longest is not None and cfg.sliding_window_size is not None and longest <= cfg.sliding_window_size:
        cfg.sliding_window_size = cfg.sliding_window_indices = None
    return cfg


def fitted(built: Built, batch_size: int, seq: int) -> tuple[int, int]:
    """(rows, tokens a row) of a step of ``batch_size`` x ``seq`` tokens for ``built``: a model
    whose positions end before ``seq`` (GPT-2's 1024) takes as many rows of its longest
    sequence as the same tokens fill."""
    if built.max_seq is None or seq <= built.max_seq or built.image is not None:
        return batch_size, seq
    return max(1, batch_size * seq // built.max_seq), built.max_seq


def hf_causal_lm(name: str, layers: int, tiny: bool, **options):
    """(transformers' causal LM ``name`` of ``HF`` with ``layers`` layers, its sizes):
    the training benchmark's and the decode benchmark's, ``options`` their config's own."""
    import transformers

    kind = name.split("-", 1)[1]
    if kind == "GPT2":
        sizes = TINY_GPT2 if tiny else HF_SIZES[name]
        cfg = transformers.GPT2Config(num_hidden_layers=layers, attn_implementation="sdpa", **NO_DROPOUT, **options,
                                      **sizes)
        return transformers.GPT2LMHeadModel(cfg), sizes
    sizes = dict(TINY_HF, **TINY_HF_MORE.get(name, {})) if tiny else HF_SIZES[name]
    cfg = getattr(transformers, f"{kind}Config")(num_hidden_layers=layers,
                                                 attn_implementation=HF_ATTENTION.get(name, "sdpa"), **options, **sizes)
    return getattr(transformers, f"{kind}ForCausalLM")(cfg), sizes


def batch(built: Built, batch_size: int, seq: int, device="cpu", seed: int = 1):
    """Token ids and targets, a few targets ignored (a prompt's tokens), ``fitted`` to the
    model's positions. An image model takes as many images as ``batch_size * seq`` tokens
    fill (a patch a token, and the class token), at least one, and a label each."""
    g = torch.Generator().manual_seed(seed)
    batch_size, seq = fitted(built, batch_size, seq)
    if built.image is not None:
        side, patch = built.image
        images = max(1, batch_size * seq // ((side // patch) ** 2 + 1))
        pixels = torch.randn(images, 3, side, side, generator=g)
        labels = torch.randint(0, built.vocab, (images,), generator=g)
        dtype = next(built.module.parameters()).dtype
        return pixels.to(device, dtype), labels.to(device)
    idx = torch.randint(0, built.vocab, (batch_size, seq), generator=g)
    targets = torch.randint(0, built.vocab, (batch_size, seq), generator=g)
    targets[:, :3] = -100
    return idx.to(device), targets.to(device)
