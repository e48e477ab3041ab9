"""thunder's own op-consistency test, shipped in its wheel, with fuser_ex as the executor
under test (via ``tests/thunder_suites/fuser_plugin.py``), for the dtypes of the ops we
claim. Runs in a subprocess so thunder's test modules see the plugin first."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_core_vs_torch_consistency_with_fuser_ex():
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-p", "tests.thunder_suites.fuser_plugin", "--pyargs", "thunder.tests.test_ops",
        "-k", "test_core_vs_torch_consistency and (float32 or int64 or bool8) and not cuda",
        "-W", "ignore::DeprecationWarning",
    ]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    tail = "\n".join(proc.stdout.splitlines()[-30:])
    assert proc.returncode == 0, tail
    assert " passed" in tail
