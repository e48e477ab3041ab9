"""Long rows (dev aid; GPU machine): log-softmax and logsumexp over LM vocabularies (bf16
logits upcast to fp32, as a cross-entropy loss reads them), a softmax and a layer norm of
long rows. Prints ms for eager, torch.compile and thunder+fuser under each of VARIANTS
(module constants patched: "no flat" loads a row of odd length in vectors of one element,
as session 18's kernels did), and the fuser's TB/s (bytes read
plus written once) as a fraction of a device-to-device copy measured in the same call,
for the last variant. Each result is checked against eager; the row tiling of each
program is printed too."""
import os
import warnings

import thunder_fuser  # noqa: F401
import thunder
import torch
import torch.nn.functional as F

from benchmarks.run import copy_bandwidth
from benchmarks.timing import device_ms
from thunder_fuser import fuser_ex
from thunder_fuser.kernels import backend, cache, cute_emit, geometry
from thunder_fuser.kernels.backend import KernelFallbackWarning

VARIANTS = {  # name -> {(module, constant): value}; the default last
    "no flat": {(geometry, "FLAT_ROWS"): False},  # rows of odd length in vectors of one element
    "default": {},
}


def _bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


CASES = {
    "log_softmax fp32 of bf16 [4096, 32000]": (lambda x: torch.log_softmax(x.float(), -1), lambda: (_bf(4096, 32000),)),
    "log_softmax fp32 of bf16 [2048, 50257]": (lambda x: torch.log_softmax(x.float(), -1), lambda: (_bf(2048, 50257),)),
    "log_softmax fp32 of bf16 [4096, 32001]": (lambda x: torch.log_softmax(x.float(), -1), lambda: (_bf(4096, 32001),)),
    "log_softmax fp32 of bf16 [1024, 128256]": (lambda x: torch.log_softmax(x.float(), -1), lambda: (_bf(1024, 128256),)),
    "logsumexp fp32 of bf16 [2048, 128256]": (lambda x: torch.logsumexp(x.float(), -1), lambda: (_bf(2048, 128256),)),
    "logsumexp fp32 of bf16 [2048, 50257]": (lambda x: torch.logsumexp(x.float(), -1), lambda: (_bf(2048, 50257),)),
    "softmax bf16 [2048, 128256]": (lambda x: torch.softmax(x, -1), lambda: (_bf(2048, 128256),)),
    "layer_norm bf16 [2048, 65536]": (lambda x: F.layer_norm(x, (65536,)), lambda: (_bf(2048, 65536),)),
    "softmax bf16 [16384, 8192]": (lambda x: torch.softmax(x, -1), lambda: (_bf(16384, 8192),)),
    "layer_norm bf16 [8192, 16384]": (lambda x: F.layer_norm(x, (16384,)), lambda: (_bf(8192, 16384),)),
    "softmax fp32 [4096, 20000]": (lambda x: torch.softmax(x, -1), lambda: (_bf(4096, 20000).float(),)),
}


def _tiling(jfn) -> str:
    from thunder_fuser.explain import _fusions

    out = []
    for runner in _fusions(thunder.last_traces(jfn)[-1]):
        for plan in runner.plans.values():
            for k in plan.kernels.values():
                for p in (k.parts if k else ()):
                    g = p.geo
                    how = ("columns" if g.columns else f"split rows, threads={g.row_threads}" if g.split_rows
                           else f"threads={g.row_threads} vectors={'looped' if g.looped else g.row_vectors}"
                           + (" +column sums" if g.across else ""))
                    out.append(f"V={g.vector} {how}" + (f" splits={g.splits[0]}" if g.splits else ""))
    return "; ".join(out)


def _tensors(x) -> list:
    return [t for t in (x if isinstance(x, (tuple, list)) else (x,)) if isinstance(t, torch.Tensor)]


def main(cases: dict = CASES, variants: dict = VARIANTS):
    copy = copy_bandwidth()
    print(f"device-to-device copy {copy:.2f} TB/s")
    rows = []
    for name, (fn, make) in cases.items():
        args = make()
        want = fn(*args)
        ms = [device_ms(fn, [args])[0], device_ms(torch.compile(fn), [args])[0]]
        tiling = ""
        for variant, patch in variants.items():
            saved = {k: getattr(*k) for k in patch}
            for (mod, attr), v in patch.items():
                setattr(mod, attr, v)
            cache.clear_memory()  # the patched constants are not in the compile key: compiled afresh
            os.environ["THUNDER_FUSER_DISK_CACHE"] = "0"
            try:
                jfn = thunder.jit(fn, executors=[fuser_ex])
                backend.forget_warnings()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", KernelFallbackWarning)
                    got = jfn(*args)
                fb = [str(w.message)[:200] for w in caught if issubclass(w.category, KernelFallbackWarning)]
                tiling = _tiling(jfn) + (f" FALLBACK {fb}" if fb else "")
                try:
                    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
                except AssertionError as e:  # reported, and the case's other variants still run
                    print(f"{name}, {variant} ({tiling}): MISMATCH {str(e)[:300]}", flush=True)
                    ms.append(float("nan"))
                    continue
                ms.append(device_ms(jfn, [args])[0])
            finally:
                for (mod, attr), v in saved.items():
                    setattr(mod, attr, v)
        moved = sum(a.numel() * a.element_size() for a in _tensors(args) + _tensors(want))
        rows.append((name, ms, moved / (ms[-1] * 1e-3) / 1e12 / copy, tiling))
        print(name, ms, tiling, flush=True)
    print(f"\n{'case':42s} {'eager':>7s} {'compile':>7s}" + "".join(f" {v:>9s}" for v in variants)
          + f" {'x comp':>6s} {'of copy':>7s}  tiling")
    for name, ms, frac, tiling in rows:
        print(f"{name:42s} {ms[0]:7.4f} {ms[1]:7.4f}" + "".join(f" {t:9.4f}" for t in ms[2:])
              + f" {ms[1] / ms[-1]:6.2f} {frac:7.0%}  {tiling}")


if __name__ == "__main__":
    main()
