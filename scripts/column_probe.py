"""Column reductions (dev aid; GPU machine): channel statistics of channels-last
activations, the weight gradient of an RMSNorm and the bias gradient of a linear layer,
each a reduction over many rows of a few thousand columns. Prints ms for eager,
torch.compile and thunder+fuser under each of VARIANTS (``long_rows_probe``'s table:
module constants patched; "s15" is session 15's loop, one row per step, and its splits;
"no cap" lifts ``COLUMN_VAR_SPLITS_PER_SM``; "4 blocks" fills 4 blocks per SM with the splits,
not 8). var's one division per row (not per element) is in every variant."""
import sys

import torch

from scripts.long_rows_probe import main
from thunder_fuser.kernels import cute_emit, geometry


def _bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def channel_stats(x):
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3))
    return mean, var


def rmsnorm_weight_grad(g, x, rstd):
    return (g.float() * (x.float() * rstd).to(torch.bfloat16).float()).sum(0).to(torch.bfloat16)


CASES = {
    "var_mean over (0, 2, 3), NHWC bf16 [64, 256, 56, 56]": (
        channel_stats, lambda: (_bf(64, 256, 56, 56).to(memory_format=torch.channels_last),)),
    "var_mean over (0, 2, 3), NHWC bf16 [32, 64, 112, 112]": (
        channel_stats, lambda: (_bf(32, 64, 112, 112).to(memory_format=torch.channels_last),)),
    "rmsnorm weight grad bf16 [16384, 4096]": (
        rmsnorm_weight_grad, lambda: (_bf(16384, 4096), _bf(16384, 4096), torch.rand(16384, 1, device="cuda") + 0.5)),
    "bias grad sum(0) bf16 [65536, 1024]": (lambda g: g.sum(0), lambda: (_bf(65536, 1024),)),
    "bias grad sum(0) bf16 [262144, 256]": (lambda g: g.sum(0), lambda: (_bf(262144, 256),)),
}

VARIANTS = {
    "s15": {(cute_emit, "STREAM_UNROLL"): 1, (geometry, "COLUMN_VAR_SPLITS_PER_SM"): 8},
    "no cap": {(geometry, "COLUMN_VAR_SPLITS_PER_SM"): 8},
    "4 blocks": {(geometry, "COLUMN_BLOCKS_PER_SM"): 4},
    "default": {},
}

if __name__ == "__main__":
    main(CASES, VARIANTS if len(sys.argv) < 2 else {k: VARIANTS[k] for k in sys.argv[1:]})
