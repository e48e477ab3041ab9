"""thunder's own test suites, shipped in its wheel, with fuser_ex as the executor under test
(via ``tests/thunder_suites/fuser_plugin.py``): op consistency for the dtypes of the ops we
claim, and the in-place suites. Each runs in a subprocess so thunder's test modules see the
plugin first; its output streams through (``-s`` shows thunder's progress as it runs).

Marked ``thunder_suites``: they take longer than the rest of the tests together, so the
README's test command leaves them out and its second command runs them
(``python -m pytest tests -m thunder_suites -s -q``); ``.ci/run`` runs both."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.thunder_suites
ROOT = Path(__file__).resolve().parents[1]


def _run_thunder_suite(modules: list[str], selection: str, plugin: str = "tests.thunder_suites.fuser_plugin",
                       **env_vars) -> str:
    rc, tail = _stream(["--pyargs", *modules, "-k", selection], plugin, **env_vars)
    assert rc == 0, tail
    assert " passed" in tail
    return tail


def _stream(args: list[str], plugin: str = "tests.thunder_suites.fuser_plugin", **env_vars) -> tuple[int, str]:
    """pytest over thunder's modules in a subprocess, its output printed as it comes: its
    exit status and its last 30 lines."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", plugin, *args,
           "-W", "ignore::DeprecationWarning"]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env_vars)
    lines = []
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            print(line, end="", flush=True)
        rc = proc.wait(timeout=3000)
    return rc, "\n".join(lines[-30:])


def test_core_vs_torch_consistency_with_fuser_ex():
    _run_thunder_suite(
        ["thunder.tests.test_ops"], "test_core_vs_torch_consistency and (float32 or int64 or bool8) and not cuda"
    )


def test_core_vs_torch_consistency_through_lowered_kernel_programs():
    """The same OpInfo samples with every segment a kernel template covers run as its
    lowered program (torch over the kernel's operand views): lowering and geometry checked
    on hundreds of shapes, strides and op combinations, on the CPU."""
    _run_thunder_suite(
        ["thunder.tests.test_ops"], "test_core_vs_torch_consistency and (float32 or int64 or bool8) and not cuda",
        THUNDER_FUSER_KERNELS="torch",
    )


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_thunder_inplace_suites_with_fuser_ex(kernels):
    """thunder/tests/test_update_aliases.py and test_inplace_copy.py (CPU tests; their CUDA
    tests need a GPU), on the reference backend and through the lowered kernel programs.
    Skips with reasons: tests/thunder_suites/fuser_plugin.py."""
    tail = _run_thunder_suite(
        ["thunder.tests.test_update_aliases", "thunder.tests.test_inplace_copy"], "not cuda",
        THUNDER_FUSER_KERNELS=kernels,
    )
    assert " failed" not in tail


def test_thunders_interpreter_suites_with_our_speedups():
    """thunder/tests/test_interpreter.py and test_jit_general.py, with thunder's own
    executors and ``patches/interpreter_speedups.py`` installed (the package's import installs it):
    the interpreter we change traces what thunder's own tests expect. One test is left
    out: ``test_autograd_function_apply`` calls torch's ``autograd_function_apply`` without
    the ``saved_for_backward_idx`` torch 2.13 requires, so it raises in eager torch, with or
    without the speed-ups (checked: 326 passed, 1 failed both ways; 150 s against 285 s)."""
    tail = _run_thunder_suite(
        ["thunder.tests.test_interpreter", "thunder.tests.test_jit_general"], "not test_autograd_function_apply",
        plugin="tests.thunder_suites.compat_plugin",
    )
    assert " failed" not in tail


def test_thunder_distributed_suites_with_fuser_ex():
    """thunder/tests/distributed/test_ddp.py and test_fsdp.py with fuser_ex (issue 34). Each of
    their test classes needs CUDA, NCCL and two GPUs (``skipUnless``) and places tensors on
    ``cuda:rank``, so on a machine with fewer they all skip; with two GPUs they run here as
    they are. None may fail; ``tests/test_distributed.py`` runs DDP and FSDP on gloo."""
    rc, tail = _stream(["--pyargs", "thunder.tests.distributed.test_ddp", "thunder.tests.distributed.test_fsdp",
                        "-k", "not transformer_engine", "-rs"])
    assert rc in (0, 5), tail  # 5: every test skipped
    assert " failed" not in tail and " error" not in tail, tail
    import torch

    if torch.cuda.device_count() < 2:
        assert "passed" not in tail and "skipped" in tail, tail
