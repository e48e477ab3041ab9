"""Which segments run generated kernels, and the one warning when one cannot.

``THUNDER_FUSER_KERNELS`` chooses: ``auto`` (default: CuTe DSL kernels for CUDA tensors when
``nvidia-cutlass-dsl`` imports, the reference backend otherwise), ``cute``, ``torch`` (run
lowered programs with torch on any device: the CPU check of lowering and geometry) or
``off`` (reference backend everywhere).
"""

from __future__ import annotations

import warnings

import torch
from thunder_fuser import config

KERNEL_KINDS = ("pointwise", "transpose", "resize", "reduction", "normalization")
_warned: set = set()
_cute_ok: bool | None = None


def _device_of(env, region):
    for v in region.inputs:
        t = env.get(id(v))
        if isinstance(t, torch.Tensor):
            return t.device
    return None


def cute_available() -> bool:
    """Whether CuTe DSL kernels can run: both packages import. TVM-FFI is imported here, once
    per process with the DSL, rather than by the first ``load_module`` (which would charge
    its ~40-100 ms import to the first cached kernel a process loads)."""
    global _cute_ok
    if _cute_ok is None:
        try:
            import cutlass.cute  # noqa: F401
            import tvm_ffi  # noqa: F401

            _cute_ok = True
        except Exception:  # noqa: BLE001
            _cute_ok = False
    return _cute_ok


def kernel_mode(env, region) -> str | None:
    if config.choice("THUNDER_FUSER_KERNELS") == "torch":
        return "torch"
    dev = _device_of(env, region)
    return "cute" if dev is not None and cute_on(dev.type) else None


def cute_on(device_type: str) -> bool:
    """Do CuTe kernels run on a device of this type (``THUNDER_FUSER_KERNELS``: ``auto``,
    the default, where the DSL imports; ``cute``; ``torch`` or ``off``: never)?"""
    choice = config.choice("THUNDER_FUSER_KERNELS")
    return device_type == "cuda" and (choice == "cute" or (choice == "auto" and cute_available()))


class KernelFallbackWarning(UserWarning):
    """A segment runs on the reference backend because no kernel could be generated."""


class KernelBugWarning(KernelFallbackWarning):
    """A segment runs on the reference backend because building its kernel raised something
    other than ``Unsupported``: a bug in lowering, geometry or code generation, whatever the
    backend (the torch backend warns of these too). Results stay right; the test suite makes
    this warning an error, so such a bug fails CI instead of hiding behind the fallback."""


def warn_fallback(region_name: str, seg, reason: str, bug: bool = False) -> None:
    key = (region_name, seg.index, reason)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(
        f"thunder_fuser: {region_name} segment {seg.index} ({seg.describe()}) runs on the reference backend: {reason}",
        KernelBugWarning if bug else KernelFallbackWarning,
        stacklevel=3,
    )


def forget_warnings() -> None:
    """Warn again for segments that already warned (each warns once per process): the
    benchmark harness records each contender's fallbacks apart."""
    _warned.clear()


def arch_of(device) -> str:
    """The GPU architecture kernels are compiled for: ``CUTE_DSL_ARCH``, else the device's,
    else an H100's (off a GPU)."""
    if config.raw("CUTE_DSL_ARCH"):
        return config.raw("CUTE_DSL_ARCH")
    if device is not None and getattr(device, "type", None) == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    return "sm_90a"


EXTRA_OPTIONS = ""  # e.g. " --keep-ptx" (tests read the PTX from the compiled function's artifacts)


def compile_options(arch: str) -> str:
    """``cute.compile``'s options for every kernel: TVM-FFI calls, the architecture, and
    ``EXTRA_OPTIONS``."""
    return f"--enable-tvm-ffi --gpu-arch {arch}" + EXTRA_OPTIONS
