"""pytest plugin: run thunder's own shipped test-suites with ``fuser_ex`` as the executor
under test. Loaded with ``-p tests.thunder_suites.fuser_plugin`` before thunder's test
modules are imported, it swaps thunder's list of test executors for ours."""

import thunder_fuser  # noqa: F401  (compat stubs before thunder)
from thunder_fuser import fuser_ex

import torch
import thunder.tests.framework as framework
from thunder.core import devices, dtypes


class FuserTestExecutor(framework.TestExecutor):
    name = "fuser"
    supported_devicetypes = (devices.DeviceType.CPU, devices.DeviceType.CUDA)
    supported_dtypes = (dtypes.dtype,)

    def executors_list(self):
        return [fuser_ex]

    def version(self):
        return torch.__version__


FuserExecutor = FuserTestExecutor()
framework._all_test_executors = lambda: [FuserExecutor]
framework.TorchExecutor = FuserExecutor


# Failures that thunder's torch executor has too on this torch, with the reason.
KNOWN_THUNDER_FAILURES = {
    "test_core_vs_torch_consistency_cross_entropy_fuser_cpu": (
        "thunder 0.2.6 reuses the trace cached for weight=None when a later sample passes a weight "
        "tensor; its own torch executor fails the same way (opinfos.py skips cross_entropy on CPU for 'torch')"
    ),
    "test_higher_order_inplace_alias_update_fuser": (
        "thunder 0.2.6's interpreter cannot trace torch 2.13's torch.fx codegen (len() of a "
        "MappingKeysView raises TypeError while recompiling the graph module); its torch executor "
        "fails identically"
    ),
}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        for prefix, reason in KNOWN_THUNDER_FAILURES.items():
            if item.name.startswith(prefix):
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item):
    """Seed torch before each test. thunder's OpInfo samples draw from torch's global RNG
    unseeded, and its float32 check compares element by element against torch's own fp32
    result: about one sample in ten thousand (an instance_norm row of three nearly equal
    values, where the variance cancels) lands thunder's decomposition a few ulps behind
    torch's fused kernel. thunder's torch executor has the same odds (6,000 random
    instance_norm samples: no failure for either). Seeding makes CI reproducible."""
    torch.manual_seed(0)
