"""Decode steps with a KV cache beside every peer (issue 33): wall time per one-token step at
batch 1, and the cache and logits against eager's.

    python -m benchmarks.decode --out DIR [--model Llama-3.2-1B|hf-Llama --layers 4 --steps 200]

litgpt's ``GPT`` with its own KV cache (``set_kv_cache``), or (``--model hf-Llama``,
``hf-Qwen2``) a transformers model with its ``StaticCache`` (its default ``DynamicCache``
does not trace in thunder 0.2.6: ``tests/test_models.py``), real config cut to
``--layers``, bf16 on a GPU (tiny fp32 on the CPU: the harness's smoke test). Per
contender: a fresh model with the same weights and cache, a 16-token prefill, 4 steps
with the same given tokens for every contender (its own argmax would pick another token
wherever random weights give near-ties, and every later cache entry would differ), whose
logits and every layer's cache are checked against eager's, then ``WARMUP`` untimed steps.
Then ``--steps`` timed one-token steps each, on the wall clock (the host waits for each,
as generation does), in ``ROUNDS`` turns over all the contenders: a drift of the lent
host's speed falls on all of them alike. Contenders: eager, torch.compile (default and
mode="reduce-overhead"), thunder + torch.compile executor, thunder + fuser, and thunder +
fuser replayed as CUDA graphs (``thunder_fuser.graphed``). Writes ``decode.json``; prints
a table last.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback

import torch

from benchmarks import cli
from benchmarks.contenders import run_label, wrap  # imports thunder_fuser before thunder (torch compat stubs)
from benchmarks.model_zoo import HF, hf_causal_lm

CONTENDERS = ("eager", "torch.compile", "torch.compile reduce-overhead", "thunder+torchcompile", "thunder+fuser",
              "thunder+fuser graphed")
PROMPT = 16
# untimed steps before the timed ones, for every contender: a step of ours ran 2.46 ms (median
# of its first 200) then 1.71-1.82 on one H100 host, right after a first call that compiled
# kernels in worker processes
WARMUP = 100
ROUNDS = 10  # the timed steps, split in turns over the contenders (``main``)


class HFStaticDecode(torch.nn.Module):
    """A transformers causal LM with its ``StaticCache`` (preallocated, written in place by
    ``index_copy_``), called as litgpt's ``GPT`` is: ``(idx, input_pos) -> logits``."""

    def __init__(self, model, cache):
        super().__init__()
        self.model, self.cache = model, cache

    def forward(self, idx, input_pos):
        return self.model(input_ids=idx, past_key_values=self.cache, cache_position=input_pos, use_cache=True).logits

    def move_cache(self) -> None:
        """Hand the model a new ``StaticCache`` holding the old one's contents, and drop the
        old one (its memory goes back to the allocator): a step that kept writing it would
        lose its writes, which the tests would see."""
        import transformers

        old, k = self.cache, self.cache.key_cache[0]
        self.cache = transformers.StaticCache(config=self.model.config, max_batch_size=1,
                                              max_cache_len=old.max_cache_len, device=k.device, dtype=k.dtype)
        for new, was in zip([*self.cache.key_cache, *self.cache.value_cache], [*old.key_cache, *old.value_cache]):
            new.copy_(was)


def _model(name: str, layers: int, device, dtype, state=None, tiny: bool | None = None):
    """(module, vocabulary size): litgpt's ``GPT`` with its KV cache, or (``hf-Llama``,
    ``hf-Qwen2``) a transformers model with its static cache; real sizes on a GPU, tiny
    ones on the CPU, unless ``tiny`` says."""
    torch.manual_seed(0)
    tiny = device.type != "cuda" if tiny is None else tiny
    if name in HF:
        import transformers

        m, sizes = hf_causal_lm(name, layers, tiny=tiny)
        if state is not None:
            m.load_state_dict(state, strict=False)
        m = m.to(device=device, dtype=dtype).eval()
        cache = transformers.StaticCache(config=m.config, max_batch_size=1, max_cache_len=512, device=device,
                                         dtype=dtype)
        return HFStaticDecode(m, cache), sizes["vocab_size"]
    import litgpt

    sizes = {} if not tiny else dict(n_embd=64, n_head=4, n_query_groups=2, head_size=16,
                                                  intermediate_size=128, padded_vocab_size=512, vocab_size=500)
    cfg = litgpt.Config.from_name(name, n_layer=layers, block_size=1024, **sizes)
    m = litgpt.GPT(cfg)
    if state is not None:
        m.load_state_dict(state, strict=False)
    m = m.to(device=device, dtype=dtype).eval()
    m.set_kv_cache(batch_size=1, max_seq_length=512, device=device, dtype=dtype)
    return m, cfg.vocab_size


def _caches(m) -> list[torch.Tensor]:
    if isinstance(m, HFStaticDecode):
        return list(m.cache.key_cache) + list(m.cache.value_cache)
    return [t for block in m.transformer.h for t in (block.attn.kv_cache.k, block.attn.kv_cache.v)]


class _Contender:
    """One contender's model, built with the same weights and cache as the others', its
    prefill and 4 checked steps done (``check``); ``steps`` then times one-token steps on the
    wall clock, the host waiting for each (generation does: the next token is its argmax)."""

    def __init__(self, kind, name, layers, device, dtype, state, prompt, tokens):
        self.m, _ = _model(name, layers, device, dtype, state)
        self.fn = wrap(kind, self.m)
        self.device, self.dtype = device, dtype
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.r: dict = {"error": None}
        self.times: list[float] = []
        self.i = 0
        with torch.no_grad():
            t0 = time.perf_counter()
            self.fn(prompt, input_pos=torch.arange(PROMPT, device=device))
            self.sync()
            self.r["prefill_s"] = round(time.perf_counter() - t0, 2)
            check = []
            for pos, token in zip(range(PROMPT, PROMPT + 4), tokens):
                logits = self.fn(token.view(1, 1), input_pos=torch.tensor([pos], device=device))
                check.append(logits.float().cpu())
        self.r["caches"] = [c.float().cpu() for c in _caches(self.m)]
        self.r["logits"] = check
        self.token = logits.argmax(-1)

    def steps(self, n: int, timed: bool = True) -> None:
        with torch.no_grad():
            for _ in range(n):
                pos = PROMPT + 4 + self.i % (480 - PROMPT)
                self.i += 1
                t0 = time.perf_counter()
                logits = self.fn(self.token, input_pos=torch.tensor([pos], device=self.device))
                self.token = logits.argmax(-1)  # the next step's input: the host waits for this one
                self.sync()
                if timed:
                    self.times.append((time.perf_counter() - t0) * 1000)

    def result(self, ref) -> dict:
        r = self.r
        if self.times:
            r["step_ms"] = round(statistics.median(self.times), 3)
        if ref is not None and ref is not r:
            tol = 3e-2 if self.dtype == torch.bfloat16 else 1e-4

            def rel(a, b):
                return ((a - b).norm() / (b.norm() + 1e-12)).item()

            r["cache_rel_err"] = max(rel(a, b) for a, b in zip(r["caches"], ref["caches"]))
            r["logits_rel_err"] = max(rel(a, b) for a, b in zip(r["logits"], ref["logits"]))
            if r["cache_rel_err"] > tol or r["logits_rel_err"] > tol:
                r["error"] = f"wrong result: cache {r['cache_rel_err']:.3g}, logits {r['logits_rel_err']:.3g}"
        if hasattr(self.fn, "ungraphed"):
            r["ungraphed"] = list(self.fn.ungraphed.values())
            r["captures"] = self.fn.captures
            r["captured_MiB"] = round(self.fn.captured_bytes / 2**20, 2)  # the graphs' private pool
        return r


def main(argv=None) -> None:
    ap = cli.parser("benchmarks.decode", __doc__, epilog=f"contenders: {', '.join(CONTENDERS)}\n"
                    "Without a CUDA GPU the models run in fp32 on the CPU (a smoke test).")
    ap.add_argument("--out", default="benchmarks/results", help="folder for decode.json")
    ap.add_argument("--model", default="Llama-3.2-1B", help="the model, by its litgpt or transformers name")
    ap.add_argument("--layers", type=int, default=4, help="transformer layers")
    ap.add_argument("--steps", type=int, default=200, help="timed decode steps per contender, in turns")
    ap.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated contender names (below)")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device, dtype = (torch.device("cuda"), torch.bfloat16) if cuda else (torch.device("cpu"), torch.float32)
    m, vocab = _model(a.model, a.layers, device, dtype)
    inner = m.model if isinstance(m, HFStaticDecode) else m
    state = {k: v for k, v in inner.state_dict().items() if "kv_cache" not in k}
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (1, PROMPT), generator=g).to(device)
    tokens = torch.randint(0, vocab, (4,), generator=g).to(device)
    del m
    results, live = {}, {}
    for kind in [c for c in a.contenders.split(",") if c]:
        label = run_label(kind, results)
        try:
            live[label] = _Contender(kind, a.model, a.layers, device, dtype, state, prompt, tokens)
            live[label].steps(WARMUP, timed=False)
            results[label] = live[label].r
        except Exception as e:  # noqa: BLE001 - a failing contender is reported, never dropped
            traceback.print_exc()
            results[label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            live.pop(label, None)
    # the timed steps in rounds, every contender in turn: a lent host's speed drifts by tens
    # of percent within minutes, and a host-bound step follows it; interleaved, each
    # contender's median is taken over the same stretch of time
    for _ in range(ROUNDS):
        for label, c in list(live.items()):
            try:
                c.steps(max(1, a.steps // ROUNDS))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                results[label] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                live.pop(label)
    ref = results["eager"] if "eager" in live else None
    for label, c in live.items():
        results[label] = c.result(ref)
    for r in results.values():
        r.pop("caches", None)
        r.pop("logits", None)
    doc = {"device": torch.cuda.get_device_name() if cuda else "CPU (tiny model: a smoke test)", "model": a.model,
           "layers": a.layers, "steps": a.steps, "contenders": results}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "decode.json"), "w") as f:
        json.dump(doc, f, indent=1)
    eager = results.get("eager", {}).get("step_ms")
    print("| contender | wall ms per step | x eager | cache rel err | error |\n| --- | ---: | ---: | ---: | --- |")
    for kind, r in results.items():
        ratio = f"{r['step_ms'] / eager:.2f}" if eager and r.get("step_ms") else ""
        print(f"| {kind} | {r.get('step_ms', '')} | {ratio} | {r.get('cache_rel_err', '')} | {(r.get('error') or '')[:80]} |")


if __name__ == "__main__":
    main()
