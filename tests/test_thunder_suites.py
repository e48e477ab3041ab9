"""thunder's own test suites, shipped in its wheel, with fuser_ex as the executor under test
(via ``tests/thunder_suites/fuser_plugin.py``): op consistency for the dtypes of the ops we
claim, and the in-place suites. Each runs in a subprocess so thunder's test modules see the
plugin first."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_thunder_suite(modules: list[str], selection: str, plugin: str = "tests.thunder_suites.fuser_plugin",
                       **env_vars) -> str:
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", plugin, "--pyargs", *modules,
        "-k", selection, "-W", "ignore::DeprecationWarning",
    ]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env_vars)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    tail = "\n".join(proc.stdout.splitlines()[-30:])
    assert proc.returncode == 0, tail
    assert " passed" in tail
    return tail


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
    executors and ``interpreter_speedups.py`` installed (the package's import installs it):
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
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.thunder_suites.fuser_plugin",
           "--pyargs", "thunder.tests.distributed.test_ddp", "thunder.tests.distributed.test_fsdp",
           "-k", "not transformer_engine", "-W", "ignore::DeprecationWarning", "-rs"]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    tail = "\n".join(proc.stdout.splitlines()[-30:])
    assert proc.returncode in (0, 5), tail  # 5: every test skipped
    assert " failed" not in tail and " error" not in tail, tail
    import torch

    if torch.cuda.device_count() < 2:
        assert "passed" not in tail and "skipped" in tail, tail
