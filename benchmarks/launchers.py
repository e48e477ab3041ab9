"""GPU time of a profiled step by what launched it (``THUNDER_FUSER_RANGES=1`` makes each
region call a profiler range of its name): the region (its kernels, and any copy torch makes
for it, named apart) or the torch op between regions. This is how a step's copies are
accounted for (``scripts/decode_profile.py``, ``scripts/step_profile.py``)."""

from __future__ import annotations

import torch


def _chain(e) -> list:
    """``e`` and the CPU ranges and ops around it, innermost first."""
    chain, p = [e], e.cpu_parent
    while p is not None:
        chain.append(p)
        p = p.cpu_parent
    return chain


def by_launcher(prof, steps: int) -> dict[str, float]:
    """GPU us per step by what launched it: the innermost region range (``fuserN``) around
    the launch, else the outermost torch op (inside the autograd engine's node functions, in
    a backward); copies inside a region are named apart."""
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU or e.self_device_time_total <= 0:
            continue
        chain = _chain(e)
        region = next((c.name for c in chain if c.name.startswith("fuser") and "attention" not in c.name), None)
        # the backward runs inside the autograd engine's node functions: name the op within
        outer = [c for c in chain if not c.name.startswith("autograd::engine")] or chain
        if region is None:
            key = outer[-1].name
        elif e.name.startswith("fuser"):
            key = region
        else:
            key = f"{region} / {e.name}"  # a torch op inside a region call (a copy for an output)
        out[key] = out.get(key, 0.0) + e.self_device_time_total / steps
    return out


COPY_OPS = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::to")


def copy_chains(prof, steps: int) -> dict[str, float]:
    """GPU us per step of each copy op (``COPY_OPS`` with device time of its own), keyed by
    the chain of ranges and ops that made it, outermost first: where a step's copies come
    from (a region's output, thunder's torch executor, the model's own code)."""
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU or e.name not in COPY_OPS:
            continue
        if e.self_device_time_total <= 0 and not any(c.self_device_time_total > 0 for c in e.cpu_children):
            continue
        key = " > ".join(c.name for c in reversed(_chain(e)))
        out[key] = out.get(key, 0.0) + e.device_time_total / steps
    return out
