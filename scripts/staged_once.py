"""x + y.t() once in fp32 and once in bf16 through thunder + fuser, [8192, 4096]: a target
for Nsight Compute on the staged (tiled transpose) template (dev aid; GPU machine):
``ncu -k regex:kernel_cutlass python scripts/staged_once.py``."""
import thunder_fuser  # noqa: F401
import thunder
import torch

from thunder_fuser import fuser_ex

for dtype in (torch.float32, torch.bfloat16):
    x, y = torch.randn(8192, 4096, device="cuda", dtype=dtype), torch.randn(4096, 8192, device="cuda", dtype=dtype)
    f = thunder.jit(lambda x, y: x + y.t(), executors=[fuser_ex])
    torch.testing.assert_close(f(x, y), x + y.t())
    torch.cuda.synchronize()
