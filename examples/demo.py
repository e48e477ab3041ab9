"""Demo: a few training steps of litgpt's Llama-3.2-1B (its own code and config, cut to a few
layers) through thunder + fuser, checked against eager step by step.

On the CPU the model is tiny and the check is the point; on a GPU it is 2 layers at full
width, and the demo also times the steps beside torch.compile's: tokens/s, memory held
between steps and peak. It prints one fused region of the forward trace, as a user reads
it, and "matches eager" last.

    python examples/demo.py [--steps 5]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import thunder_fuser  # must come before thunder: restores torch compat stubs

import litgpt
import thunder
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's benchmarks/
from benchmarks.model_zoo import LitGPTWithLoss  # noqa: E402  (the model and its loss in one module)


def train(step_fn, model, data, steps: int, desc: str) -> list[float]:
    """``steps`` AdamW steps of ``step_fn`` (the loss of a batch); the losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    losses = []
    for i in tqdm(range(steps), desc=desc, leave=False):
        idx, targets = data[i % len(data)]
        loss = step_fn(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def speed(step_fn, model, data, steps: int) -> dict:
    """Tokens/s over ``steps`` steps, memory held after them and the peak during one."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    idx, targets = data[0]

    def one():
        step_fn(idx, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        one()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    torch.cuda.synchronize()
    tokens = idx.numel() * steps / (time.perf_counter() - t0)
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    one()
    return {"tokens/s": tokens, "held GiB": held / 2**30, "peak GiB": torch.cuda.max_memory_allocated() / 2**30}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    # litgpt's own config; on the CPU at a tiny width
    tiny = {} if cuda else dict(n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=128,
                                padded_vocab_size=512, vocab_size=500, block_size=64)
    cfg = litgpt.Config.from_name("Llama-3.2-1B", n_layer=2, **tiny)
    torch.manual_seed(0)
    model = LitGPTWithLoss(litgpt.GPT(cfg)).to(device=device, dtype=dtype)
    ref = copy.deepcopy(model)
    seq = 1024 if cuda else 32
    g = torch.Generator().manual_seed(1)
    data = [(torch.randint(0, cfg.vocab_size, (2, seq), generator=g).to(device),
             torch.randint(0, cfg.vocab_size, (2, seq), generator=g).to(device)) for _ in range(a.steps)]

    jmodel = thunder.jit(model, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())
    ours = train(jmodel, model, data, a.steps, "thunder + fuser")
    eager = train(ref, ref, data, a.steps, "eager")

    # the first fused region with a kernel of a norm, as the trace prints it
    fw = str(thunder.last_traces(jmodel)[-1]).split("\n")
    starts = [i for i, line in enumerate(fw) if "= fuser" in line]
    blocks = [fw[i:next(j for j in range(i + 1, len(fw) + 1) if j == len(fw) or not fw[j].lstrip().startswith("#"))]
              for i in starts]
    print("\n".join(next((b for b in blocks if any("[normalization" in line for line in b)), blocks[0])))
    print("loss per step, thunder + fuser:", " ".join(f"{x:.4f}" for x in ours))
    print("loss per step, eager:          ", " ".join(f"{x:.4f}" for x in eager))
    # bf16: our kernels keep fp32 intermediates where eager rounds every op to bf16
    tol = 3e-2 if cuda else 1e-4
    for i, (x, y) in enumerate(zip(ours, eager)):
        assert abs(x - y) <= tol * max(1.0, abs(y)), f"step {i}: loss {x} against eager's {y}"
    if cuda:
        tc_model = copy.deepcopy(ref)
        rows = {"thunder + fuser": speed(jmodel, model, data, 10),
                "torch.compile": speed(torch.compile(tc_model), tc_model, data, 10)}
        for name, r in rows.items():
            print(f"{name:16s} " + "  ".join(f"{k} {v:,.2f}" if "GiB" in k else f"{k} {v:,.0f}" for k, v in r.items()))
    print(f"matches eager ({device}, {dtype}, {a.steps} steps of litgpt's Llama-3.2-1B, {cfg.n_layer} layers)")


if __name__ == "__main__":
    main()
