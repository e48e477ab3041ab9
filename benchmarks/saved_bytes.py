"""What a training step holds for its backward, per layer, by contender (CPU or GPU): the
bytes of the distinct tensors autograd saves (``torch.autograd.graph.saved_tensors_hooks``
sees thunder's ``save_for_backward`` as it sees eager's and AOTAutograd's), for a model of
``benchmarks/model_zoo`` at its real width with ``L`` and ``L + 1`` layers; the difference
is one layer's. Held from the forward to the backward, these bytes are most of a step's
peak beyond its parameters, gradients and optimizer state, so the per-layer figure times
the depth compares contenders' peaks without a GPU.

    python scripts/saved_bytes.py Llama-3.2-1B,pythia-1b [--tokens 512] [--contenders eager,thunder+fuser]

``thunder+fuser no-recompute`` is thunder + fuser with ``THUNDER_FUSER_RECOMPUTE=0``.
"""

from __future__ import annotations

import argparse
import os

import torch

import thunder_fuser  # noqa: F401  (before thunder)
from benchmarks.contenders import wrap
from benchmarks.model_zoo import batch, build


def saved_bytes(name: str, layers: int, kind: str, tokens: int, device: str, dtype) -> tuple[int, dict]:
    """(bytes of the distinct storages one step saves, bytes by (shape, dtype))."""
    built = build(name, layers=layers, device=device, dtype=dtype)
    idx, targets = batch(built, 1, tokens, device=device)
    env = os.environ.get("THUNDER_FUSER_RECOMPUTE")
    if kind.endswith(" no-recompute"):
        os.environ["THUNDER_FUSER_RECOMPUTE"] = "0"
    try:
        fn = wrap(kind.removesuffix(" no-recompute"), built.module)
        fn(idx, targets)  # a first step: tracing and compilation outside the count
        seen: dict[int, int] = {}
        by_shape: dict[tuple, int] = {}

        def pack(t):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                key = t.untyped_storage().data_ptr()
                if key not in seen and not isinstance(t, torch.nn.Parameter):
                    seen[key] = t.untyped_storage().nbytes()
                    k = (tuple(t.shape), str(t.dtype).removeprefix("torch."))
                    by_shape[k] = by_shape.get(k, 0) + seen[key]
            return t

        params = {p.untyped_storage().data_ptr() for p in built.module.parameters()}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = fn(idx, targets)
        loss.backward()
        total = sum(v for k, v in seen.items() if k not in params)
        return total, by_shape
    finally:
        if env is None:
            os.environ.pop("THUNDER_FUSER_RECOMPUTE", None)
        else:
            os.environ["THUNDER_FUSER_RECOMPUTE"] = env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=1, help="L: the model is built with L and L + 1 layers")
    ap.add_argument("--contenders", default="eager,torch.compile,thunder+fuser,thunder+fuser no-recompute")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    rows = []
    for name in a.models.split(","):
        for kind in a.contenders.split(","):
            small, _ = saved_bytes(name, a.layers, kind, a.tokens, a.device, torch.bfloat16)
            big, shapes = saved_bytes(name, a.layers + 1, kind, a.tokens, a.device, torch.bfloat16)
            rows.append((name, kind, (big - small) / 2**20))
            print(f"{name:16s} {kind:30s} {(big - small) / 2**20:9.2f} MiB a layer at {a.tokens} tokens", flush=True)
    print(f"\n| model | contender | saved a layer (MiB, {a.tokens} tokens) | over eager |\n|---|---|---:|---:|")
    for name, kind, mib in rows:
        eager = next((m for n, k, m in rows if n == name and k == "eager"), None)
        print(f"| {name} | {kind} | {mib:.2f} | {mib / eager:.2f}x |" if eager else f"| {name} | {kind} | {mib:.2f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
