"""GPU time of a profiled step by what launched it (``THUNDER_FUSER_RANGES=1`` makes each
region call a profiler range of its name): the region (its kernels, and any copy torch makes
for it, named apart) or the torch op between regions. This is how a step's copies are
accounted for (``scripts/decode_profile.py``, ``scripts/step_profile.py``)."""

from __future__ import annotations

import torch


def by_launcher(prof, steps: int) -> dict[str, float]:
    """GPU us per step by what launched it: the innermost region range (``fuserN``) around
    the launch, else the outermost torch op; copies inside a region are named apart."""
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU or e.self_device_time_total <= 0:
            continue
        chain, p = [e], e.cpu_parent
        while p is not None:
            chain.append(p)
            p = p.cpu_parent
        region = next((c.name for c in chain if c.name.startswith("fuser") and "attention" not in c.name), None)
        if region is None:
            key = chain[-1].name
        elif e.name.startswith("fuser"):
            key = region
        else:
            key = f"{region} / {e.name}"  # a torch op inside a region call (a copy for an output)
        out[key] = out.get(key, 0.0) + e.self_device_time_total / steps
    return out
