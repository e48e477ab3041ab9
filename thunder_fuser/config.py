"""Every setting of thunder_fuser, declared once: its environment variable, default, meaning
and when it is read. No other module reads the environment; each asks here, and reads its
setting when the table says (so a test or a user may change one between calls).

``python -m thunder_fuser.config`` prints the table as ``docs/settings.md`` holds it (a test
keeps the two equal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_OFF = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # as the environment would spell it; "" where the default is computed
    meaning: str
    read: str  # when the value is read
    kind: str = "flag"  # flag | int | choice | list | path | text
    choices: tuple[str, ...] = ()


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("THUNDER_FUSER_KERNELS", "auto",
            "what runs a segment: `auto` (CuTe DSL kernels on CUDA where the DSL imports, the torch reference "
            "backend elsewhere), `cute`, `torch` (the lowered kernel programs run with torch: the CPU's check of "
            "what CUDA runs), `off` (the reference backend everywhere)",
            "when a region's plan is built and at each kernel launch decision", "choice", ("auto", "cute", "torch", "off")),
    Setting("THUNDER_FUSER_CACHE", "",
            "the folder of the on-disk kernel cache (default `~/.cache/thunder_fuser`)", "at each compile", "path"),
    Setting("THUNDER_FUSER_DISK_CACHE", "1", "keep compiled kernels on disk across processes", "at each compile"),
    Setting("THUNDER_FUSER_COMPILE_WORKERS", "",
            "worker processes that compile a first step's kernels while it runs on the reference backend "
            "(default: the cores less two, at most 8; `0`: compile in the calling process)",
            "when workers are started", "int"),
    Setting("THUNDER_FUSER_PROGRESS", "auto",
            "the compile status line on stderr: `auto` (on a terminal), `1` (a line per report), `0`",
            "at each report", "choice", ("auto", "0", "1")),
    Setting("THUNDER_FUSER_DUMP", "",
            "stages to print to stderr as they run, comma-separated: `region` (a region's ops as claimed), "
            "`segments` (its kernels), `layout` (each output's allocation order), `all`; each dump names its pass",
            "at each dump", "list", ("region", "segments", "layout", "all")),
    Setting("THUNDER_FUSER_RANGES", "0",
            "name each region call in a `torch.profiler` trace (a `record_function` range)",
            "when a region is built (each fusion pass)"),
    Setting("THUNDER_FUSER_DISSOLVE", "1",
            "dissolve a run of region ops between two matmuls into the runs around it", "at each fusion pass"),
    Setting("THUNDER_FUSER_RECOMPUTE", "1",
            "make again in the backward a saved tensor that pointwise ops make from values saved anyway "
            "(`passes/recompute_in_backward.py`)", "at each fusion pass"),
    Setting("THUNDER_FUSER_GQA", "auto",
            "attention reads grouped-query K and V at their own heads: their expansion to the query's heads is not "
            "made, and the backward sums their gradients over each group in the kernel "
            "(`passes/grouped_query_attention.py`): `auto` (on the CPU; on CUDA not yet, until an H100 run has "
            "checked cuDNN's grouped call), `1` (on CUDA too, where torch's check admits cuDNN), `0` (off)",
            "at each fusion pass", "choice", ("auto", "1", "0")),
    Setting("THUNDER_FUSER_DONATE", "1",
            "write a pointwise output over an input the region is the last to read", "when a region's plan is built"),
    Setting("THUNDER_FUSER_REGION_GRAPHS", "1",
            "replay a region's launches as one CUDA graph keyed on the pointers they touch",
            "when a region's straight-line code is written"),
    Setting("THUNDER_FUSER_LAUNCH_RUNS", "1",
            "`transforms()` replays runs of region calls and the matmuls between them as CUDA graphs",
            "when `transforms()` is called"),
    Setting("THUNDER_FUSER_FAST_MATH", "1",
            "in a kernel whose every store is fp16/bf16, `exp` as `ex2.approx` of one multiply and `reciprocal` as "
            "`rcp.approx` (errors of one or two fp32 ulps, far below the stores' rounding; `cute_values.fast_exp`); "
            "`0`: the exact sequences in every kernel", "at each compile"),
    Setting("THUNDER_FUSER_COMPILE_GC", "1",
            "hold Python's collector back while thunder compiles and a region builds its plan",
            "when thunder_fuser is imported"),
    Setting("THUNDER_FUSER_FAST_INTERPRETER", "1",
            "remove three costs of thunder 0.2.6's interpreter on a first call (builtins, disassembly, traceback "
            "frames)", "when thunder_fuser is imported"),
    Setting("THUNDER_FUSER_MAX_PLANS", "32",
            "plans a region keeps (one per layout of its inputs met at run time), least recently used first out; "
            "a region that builds this many warns that it keeps respecializing", "when a region builds a plan", "int"),
    Setting("THUNDER_FUSER_MAX_KERNELS", "4096",
            "compiled kernels kept in memory in a process, least recently used first out (the disk cache keeps "
            "them all)", "when a kernel is loaded", "int"),
    Setting("THUNDER_FUSER_MAX_TRACES", "256",
            "traces a `thunder.jit` function keeps in thunder's cache (one per input shape, dtype and more; thunder "
            "0.2.6 keeps every one and searches them all at each call), oldest first out; `0`: no bound",
            "when thunder caches a trace", "int"),
    Setting("THUNDER_FUSER_PATCHES", "all",
            "the corrections to thunder 0.2.6 applied when thunder_fuser is imported, comma-separated "
            "(`thunder_fuser/patches/` says what each corrects): `all`, `none`, or names",
            "when thunder_fuser is imported", "list",
            ("all", "none", "weak_dtypes", "nll_loss_backward", "scalar_tensor_grads", "trace_cache", "thunderfx_graphs",
             "foreach_ops", "dynamo_fma", "dce_tags", "alias_keys", "sequence_lengths", "split_copies", "profiler_ranges",
             "splitter_executors", "auto_registered_ops", "type_promotion", "memory_format", "jit_optimizer_step")),
    Setting("CUTE_DSL_ARCH", "",
            "CuTe DSL's own: the GPU architecture kernels compile for (e.g. `sm_90a`; default: the device's, else "
            "an H100's), which also lets a machine without a GPU compile them to PTX", "at each compile", "text"),
)}


def raw(name: str) -> str:
    """The setting as the environment spells it, else its default."""
    v = os.environ.get(_declared(name).name)
    return _declared(name).default if v is None else v


def flag(name: str) -> bool:
    v = raw(name).strip().lower()
    return (v or _declared(name).default) not in _OFF


def integer(name: str) -> int | None:
    """The number, or None where it is unset (a computed default)."""
    v = raw(name).strip()
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r}: expected a whole number ({_declared(name).meaning})") from None


def choice(name: str) -> str:
    s = _declared(name)
    v = raw(name).strip() or s.default
    if s.choices and v not in s.choices:
        raise ValueError(f"{name}={v!r}: expected one of {', '.join(s.choices)}")
    return v


def items(name: str) -> set[str]:
    """A comma-separated list, each item one of the setting's choices."""
    s = _declared(name)
    got = {p.strip() for p in raw(name).split(",") if p.strip()}
    unknown = sorted(got - set(s.choices))
    if unknown:
        raise ValueError(f"{name}: unknown {', '.join(unknown)}; the valid ones are {', '.join(s.choices)}")
    return got


def set_for_children(name: str, value: str) -> None:
    """Set a setting in this process's environment, for the processes it starts (a compile
    worker compiles for its caller's architecture)."""
    os.environ[_declared(name).name] = value


def environment() -> dict[str, str]:
    """A copy of the environment, for a child process."""
    return dict(os.environ)


def _declared(name: str) -> Setting:
    s = SETTINGS.get(name)
    if s is None:
        raise KeyError(f"{name} is no setting of thunder_fuser's (config.SETTINGS lists them)")
    return s


def markdown() -> str:
    """``docs/settings.md``."""
    lines = ["# Settings", "",
             "Every environment variable thunder_fuser reads, from `thunder_fuser/config.py` (generated: "
             "`python -m thunder_fuser.config > docs/settings.md`). A flag is off for `0`, `false`, `off` or `no`.",
             "", "| variable | default | meaning | read |", "| --- | --- | --- | --- |"]
    for s in SETTINGS.values():
        default = f"`{s.default}`" if s.default else "(computed)"
        lines.append(f"| `{s.name}` | {default} | {s.meaning} | {s.read} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
