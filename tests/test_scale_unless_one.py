"""``fuser_scale_unless_one`` (``backends/cute/families/scale_unless_one.py``): the two-pass cross-entropy's
backward scales the gradient its forward wrote, in place, unless the cotangent is one,
which the kernel checks on the device (no host sync)."""

import re
import types
from pathlib import Path

import pytest
import torch

from thunder_fuser.backends.cute import compile_workers
from thunder_fuser.backends.cute.families import scale_unless_one as scaling
from thunder_fuser.backends.cute.families.scale_unless_one import build, scale_unless_one_


@pytest.mark.parametrize("g", [1.0, 0.25, -3.0])
def test_on_the_cpu_the_host_decides(g):
    x = torch.randn(7, 13)
    expected = x * g
    out = scale_unless_one_(x, torch.tensor([g]), use_kernel=False)
    assert out is x
    torch.testing.assert_close(x, expected, atol=0, rtol=0)


def test_a_cotangent_of_the_losss_dtype_and_no_dims():
    x = torch.randn(5, 3, dtype=torch.bfloat16)
    expected = (x.float() * 0.5).to(torch.bfloat16)
    scale_unless_one_(x, torch.tensor(0.5, dtype=torch.bfloat16), use_kernel=False)
    torch.testing.assert_close(x, expected, atol=0, rtol=0)


def test_while_a_worker_compiles_the_kernel_torch_scales_then_the_kernel_launches(monkeypatch):
    """A cold first step queues the kernel (whole vectors and the ragged tail) for a compile
    worker rather than compiling it in the training process, and multiplies with torch, as
    the kernel would (one rounding); the next call waits for the worker and launches."""
    queued, launched = [], []
    monkeypatch.setattr(compile_workers, "submit", lambda digest, call, arch: queued.append(call()[2]) or True)
    monkeypatch.setattr(compile_workers, "wait", lambda digest: None)

    def kernel_stand_in(dtype, gdtype, v, arch, directory=None):
        return lambda xv, g, blocks: launched.append(v) or xv.mul_(g)

    monkeypatch.setattr(scaling, "compile_into", kernel_stand_in)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(multi_processor_count=2))
    monkeypatch.setattr(scaling, "_launchers", {})
    monkeypatch.setattr(scaling, "_queued", set())
    g = torch.tensor([0.5], dtype=torch.bfloat16)
    for call in range(2):
        x = torch.randn(8 * 512 + 3, dtype=torch.bfloat16)
        expected = (x.float() * 0.5).to(torch.bfloat16)
        assert scale_unless_one_(x, g, use_kernel=True) is x
        torch.testing.assert_close(x, expected, atol=0, rtol=0)
        if call == 0:
            assert [v for _, _, v, _ in queued] == [8, 1] and launched == []
    assert len(queued) == 2 and launched == [8, 1]


@pytest.mark.parametrize("dtype,v,gdtype", [(torch.bfloat16, 8, torch.bfloat16), (torch.bfloat16, 8, torch.float32),
                                            (torch.float32, 4, torch.float32), (torch.float64, 2, torch.float64),
                                            (torch.float16, 1, torch.float16)])
def test_the_kernel_exits_on_a_one_and_moves_whole_vectors(dtype, v, gdtype, ptx_compile):
    """The cotangent is read in its own dtype (no conversion kernel before the launch) and
    compared with one exactly: in fp32, or fp64 for an fp64 cotangent."""
    fn = build(dtype, v, "sm_90a", gdtype)
    ptx = fn.artifacts.PTX
    ptx = Path(ptx).read_text() if ptx.endswith(".ptx") else ptx
    one = {torch.float32: r"setp\.(eq|ne)\.f32\s+%p\d+, %r\d+, 0f3F800000",
           torch.float64: r"setp\.(eq|ne)\.f64\s+%p\d+, %rd\d+, 0d3FF0000000000000",
           # a half-precision one compared in its own dtype (as exact as in fp32)
           torch.bfloat16: r"mov\.b16\s+(%rs\d+), 0x3F80;[\s\S]*setp\.(eq|ne)\.bf16\s+%p\d+, %rs\d+, \1;",
           torch.float16: r"mov\.b16\s+(%rs\d+), 0x3C00;[\s\S]*setp\.(eq|ne)\.f16\s+%p\d+, %rs\d+, \1;"}[gdtype]
    assert re.search(one, ptx), "no compare of the cotangent with one"
    width = {8: "v4.b32", 4: "v4.b32", 2: "v2.b64", 1: "b16"}[v]
    assert f"ld.global.{width}" in ptx and f"st.global.{width}" in ptx, re.findall(r"(?:ld|st)\.global[.\w]*", ptx)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("numel", [1, 7, 4096, 1000003])
@pytest.mark.parametrize("g", [1.0, 0.5, float("nan")])
@pytest.mark.parametrize("gdtype", ["float32", "its own"])
def test_on_the_gpu_against_torch(dtype, numel, g, gdtype):
    x = torch.randn(numel, device="cuda").to(dtype)
    expected = x if g == 1.0 else (x.to(torch.float64) * g).to(dtype)
    before = x.clone()
    cotangent = torch.tensor(g, device="cuda", dtype=torch.float32 if gdtype == "float32" else dtype)  # no dims
    out = scale_unless_one_(x, cotangent, use_kernel=True)
    assert out is x
    if g == 1.0:
        torch.testing.assert_close(x, before, atol=0, rtol=0)
    else:
        torch.testing.assert_close(x, expected, equal_nan=True, atol=1e-6, rtol=1e-2 if dtype != torch.float64 else 1e-12)
