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

# a plan's first call runs on the reference backend while worker processes compile its
# kernels (``backends/cute/compile_workers.py``); the tests check kernels from the first call, so
# they compile in the test's process unless a test asks for workers (test_compile_workers.py)
os.environ.setdefault("THUNDER_FUSER_COMPILE_WORKERS", "0")

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


@pytest.fixture
def ptx_compile(tmp_path, monkeypatch):
    """Kernels compile for sm_90a without a GPU, keep their PTX (in ``tmp_path / "ptx"``),
    and go to a fresh disk cache (``tmp_path / "cache"``)."""
    pytest.importorskip("cutlass")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv("THUNDER_FUSER_CACHE", str(tmp_path / "cache"))
    # the kept PTX goes to the test's own folder, not the working directory
    (tmp_path / "ptx").mkdir()
    from thunder_fuser.backends.cute import backend

    monkeypatch.setattr(backend, "EXTRA_OPTIONS", f" --keep-ptx --dump-dir {tmp_path / 'ptx'}")


@pytest.fixture(params=["cpu scalars", "cuda scalars"])
def scalars(request, monkeypatch):
    """thunder reads a 0-d CPU tensor as a number in an elementwise op and broadcasts a 0-d
    CUDA tensor (``clang.maybe_broadcast``): "cuda scalars" makes the CPU trace the CUDA
    one, whose regions the CPU tests must see too (``ir/scalar_broadcasts.py``)."""
    if request.param == "cuda scalars":
        import thunder.core.utils

        monkeypatch.setattr(thunder.core.utils, "is_cpu_scalar_tensor", lambda x: False)
    return request.param
