import thunder_fuser  # noqa: F401  (restores torch compat stubs before thunder imports)

import atexit
import os
import shutil
import tempfile

# CuTe DSL writes --keep-ptx dumps to the working directory unless told otherwise: keep
# generated kernels out of the checkout (set before cutlass is imported), in a folder
# removed when the test run ends
if "CUTE_DSL_DUMP_DIR" not in os.environ:
    os.environ["CUTE_DSL_DUMP_DIR"] = tempfile.mkdtemp(prefix="thunder_fuser_dump_")
    atexit.register(shutil.rmtree, os.environ["CUTE_DSL_DUMP_DIR"], ignore_errors=True)

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=300, deadline=None, print_blob=True)
settings.register_profile("thorough", max_examples=5000, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))  # thorough: 5,000 examples


@pytest.fixture
def torch_kernels(monkeypatch):
    """Kernel segments run their lowered programs with torch (the CPU's stand-in for CuTe)."""
    monkeypatch.setenv("THUNDER_FUSER_KERNELS", "torch")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
