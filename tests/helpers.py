"""Shared test helpers: run a function jitted with fuser_ex beside eager, compare outputs
and the final contents of every input."""

from __future__ import annotations

import thunder
import torch

from thunder_fuser import fuser_ex


def clone_tensor(a: torch.Tensor) -> torch.Tensor:
    """A copy with the same storage layout: strides, offset and stride-0 dims included
    (``clone`` would make an expanded tensor dense)."""
    storage = a.detach().untyped_storage().clone()
    c = torch.empty(0, dtype=a.dtype, device=a.device).set_(storage, a.storage_offset(), a.shape, a.stride())
    return c.requires_grad_(a.requires_grad)


def clone_args(args):
    return [clone_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]


def tol(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return dict(atol=2e-2, rtol=2e-2)
    return dict(atol=1e-5, rtol=1.3e-6)


def check_vs_eager(fn, *args, executors=None, **kwargs):
    """Jit ``fn``, run it and eager on copies of ``args``; assert outputs and inputs match."""
    jfn = thunder.jit(fn, executors=executors or [fuser_ex])
    ours, theirs = clone_args(args), clone_args(args)
    got = jfn(*ours, **kwargs)
    expected = fn(*theirs, **kwargs)
    torch.testing.assert_close(got, expected, equal_nan=True, **_tol_of(expected))
    for a, b in zip(ours, theirs):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True, **_tol_of(b))
    return jfn, got


def _tol_of(x):
    if isinstance(x, torch.Tensor):
        return tol(x.dtype)
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return tol(x[0].dtype)
    return {}


def fusion_names(jfn) -> list[str]:
    return [b.sym.name for b in thunder.last_traces(jfn)[-1].bound_symbols if b.sym.name.startswith("fuser")]


def fusion_block(trace, name: str = "fuser0") -> str:
    """The lines of ``trace`` that call fusion ``name``: the call and its segments."""
    lines = str(trace).splitlines()
    start = next(i for i, l in enumerate(lines) if f"= {name}(" in l)
    end = start + 1
    while end < len(lines) and lines[end].lstrip().startswith("# ") and lines[end].startswith("    #"):
        end += 1
    return "\n".join(l.strip() for l in lines[start:end]) + "\n"


def check_layernorm_backward(device: str, shape=(64, 4097), atol=1e-4):
    """Gradients of ``F.layer_norm`` through fuser_ex against eager (backward regions mix
    row reductions, column reductions and saved broadcasts)."""
    from benchmarks.workloads import layernorm

    n = shape[-1]
    x, w, b = (torch.randn(*s, device=device).requires_grad_() for s in [shape, (n,), (n,)])
    out = thunder.jit(layernorm, executors=[fuser_ex])(x, w, b)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    layernorm(*ref).backward(grad)
    for t, r in zip((x, w, b), ref):
        torch.testing.assert_close(t.grad, r.grad, atol=atol, rtol=atol)
