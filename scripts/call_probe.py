"""What a TVM-FFI call of a CuTe DSL kernel costs on the host, by argument style (dev aid;
run on the GPU machine): a tuple of torch tensors (views made per call) against a tuple of
data pointers and a tuple of integer extents/strides built once, beside the torch pieces a
region call makes. Then, in fresh processes, where the first load of a cached kernel goes."""
import os
import subprocess
import sys
import tempfile
import time

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor, make_ptr
import torch

from benchmarks.timing import host_us


@cute.kernel
def _k(a: cute.Tensor, b: cute.Tensor, o: cute.Tensor):
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        o[0, 0] = a[0, 0] + b[0, 0]


@cute.jit
def launch_tensors(ts, stream):
    _k(ts[0], ts[1], ts[2]).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)


@cute.jit
def launch_pointers(ps, dims, anchor: cute.Tensor, stream):
    m, n, sa, sb, so = dims
    a = cute.make_tensor(ps[0], cute.make_layout((m, n), stride=(sa, 1)))
    b = cute.make_tensor(ps[1], cute.make_layout((m, n), stride=(sb, 0)))
    o = cute.make_tensor(ps[2], cute.make_layout((m, n), stride=(so, 1)))
    _k(a, b, o).launch(grid=[1, 1, 1], block=[32, 1, 1], stream=stream)


def compile_both():
    bf = cutlass.BFloat16
    m, n = cute.sym_int32(), cute.sym_int32(divisibility=8)
    fakes = (
        make_fake_tensor(bf, (m, n), (cute.sym_int64(divisibility=8), 1), assumed_align=16),
        make_fake_tensor(bf, (m, n), (0, 1), assumed_align=16),
        make_fake_tensor(bf, (m, n), (cute.sym_int64(divisibility=8), 1), assumed_align=16),
    )
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    t0 = time.perf_counter()
    ft = cute.compile(launch_tensors, fakes, stream, options="--enable-tvm-ffi")
    t1 = time.perf_counter()
    ptrs = tuple(make_ptr(bf, 0, cute.AddressSpace.gmem, assumed_align=16) for _ in range(3))
    dims = (cute.sym_int32(), cute.sym_int32(divisibility=8), cute.sym_int64(divisibility=8),
            cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8))
    anchor = make_fake_tensor(cutlass.Uint8, (1,), (1,), assumed_align=1)
    fp = cute.compile(launch_pointers, ptrs, dims, anchor, stream, options="--enable-tvm-ffi")
    print(f"compile s: tensors {t1 - t0:.2f}, pointers {time.perf_counter() - t1:.2f}")
    return ft, fp


def load_child(path: str) -> None:
    """Run in a fresh process: time each step up to the first launch of a cached kernel."""
    t = [("start", time.perf_counter())]
    import torch  # noqa: F811

    t.append(("import torch", time.perf_counter()))
    x = torch.zeros(8, 64, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    t.append(("cuda init + tensor", time.perf_counter()))
    import cutlass  # noqa: F811

    t.append(("import cutlass", time.perf_counter()))
    import cutlass.cute as cute  # noqa: F811

    t.append(("import cutlass.cute", time.perf_counter()))
    mod = cute.runtime.load_module(path, enable_tvm_ffi=True)
    t.append(("load_module", time.perf_counter()))
    fn = mod.probe_t
    t.append(("getattr fn", time.perf_counter()))
    fn((x, x.as_strided((8, 64), (0, 1)), x))
    torch.cuda.synchronize()
    t.append(("first call", time.perf_counter()))
    mod2 = cute.runtime.load_module(path.replace("_t.o", "_p.o"), enable_tvm_ffi=True)
    t.append(("second load_module", time.perf_counter()))
    getattr(mod2, "probe_p")
    fn((x, x.as_strided((8, 64), (0, 1)), x))
    torch.cuda.synchronize()
    t.append(("second call", time.perf_counter()))
    for (_, a), (name, b) in zip(t, t[1:]):
        print(f"    {name:22s} {1e3 * (b - a):8.1f} ms")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--load":
        return load_child(sys.argv[2])
    if len(sys.argv) > 2 and sys.argv[1] == "--profile":
        import cProfile
        import pstats

        torch.zeros(1, device="cuda")
        cProfile.runctx("cute.runtime.load_module(p, enable_tvm_ffi=True)", globals(), {"p": sys.argv[2]}, "/tmp/lp")
        pstats.Stats("/tmp/lp").sort_stats("cumulative").print_stats(25)
        pstats.Stats("/tmp/lp").sort_stats("tottime").print_stats(10)
        return
    import tvm_ffi  # noqa: F401

    print("torch", torch.__version__, "exchange api:", hasattr(torch.Tensor, "__dlpack_c_exchange_api__"))
    ft, fp = compile_both()
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, b = torch.randn(8, 64, **bf), torch.randn(64, **bf)
    out = torch.empty(8, 64, **bf)
    anchor = torch.empty(1, dtype=torch.uint8, device="cuda")
    bv = b.as_strided((8, 64), (0, 1))
    dev = x.device
    dims = (8, 64, 64, 0, 64)
    ptrs = (x.data_ptr(), b.data_ptr(), out.data_ptr())
    rows = [
        ("tensors, views made", lambda: ft((x, b.as_strided((8, 64), (0, 1)), out))),
        ("tensors, views ready", lambda: ft((x, bv, out))),
        ("pointers, dims ready", lambda: fp(ptrs, dims, anchor)),
        ("pointers read per call", lambda: fp((x.data_ptr(), b.data_ptr(), out.data_ptr()), dims, anchor)),
        ("three data_ptr()", lambda: (x.data_ptr(), b.data_ptr(), out.data_ptr())),
        ("torch.empty_strided", lambda: torch.empty_strided((8, 64), (64, 1), **bf)),
        ("torch.empty", lambda: torch.empty((8, 64), **bf)),
        ("empty_strided, device obj", lambda: torch.empty_strided((8, 64), (64, 1), dtype=torch.bfloat16, device=dev)),
        ("x.new_empty", lambda: x.new_empty((8, 64))),
        ("x.new_empty_strided", lambda: x.new_empty_strided((8, 64), (64, 1))),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("as_strided", lambda: b.as_strided((8, 64), (0, 1))),
        ("current_stream", lambda: torch.cuda.current_stream().cuda_stream),
        ("eager x + 1", lambda: x + 1),
    ]
    ft((x, bv, out))
    torch.cuda.synchronize()
    assert torch.equal(out[0, 0], x[0, 0] + b[0]), "tensor call wrong"
    out.zero_()
    fp(ptrs, dims, anchor)
    torch.cuda.synchronize()
    assert torch.equal(out[0, 0], x[0, 0] + b[0]), "pointer call wrong"
    print("host us per call")
    for name, fn in rows:
        print(f"  {name:26s} {host_us(fn, (), 3000):6.2f}")
    d = tempfile.mkdtemp()
    ft.export_to_c(os.path.join(d, "probe_t.o"), function_name="probe_t")
    fp.export_to_c(os.path.join(d, "probe_p.o"), function_name="probe_p")
    for i in range(2):
        print(f"  fresh process {i + 1}: first load of a cached kernel")
        subprocess.run([sys.executable, __file__, "--load", os.path.join(d, "probe_t.o")], check=False)
    print("  cProfile of the first load_module in a fresh process")
    subprocess.run([sys.executable, __file__, "--profile", os.path.join(d, "probe_t.o")], check=False)


if __name__ == "__main__":
    main()
