"""How much a CUDA graph with a cuBLAS matmul holds, and whether destroying one graph drops
the workspace the others captured on its stream still use (GPU machine, about 10 s).

torch keeps one cuBLAS workspace per (handle, stream) and allocates it at the stream's first
matmul: a capture on a stream of its own (a capture cannot run on the legacy default stream)
allocates one, which every graph captured there then reads (launch runs, ``runtime/
launch_run.py``, pay it once per process). Since pytorch#175276 ``CUDAGraph.reset`` drops the
workspaces of the stream it captured on; this prints whether the installed torch does.
"""

import gc

import torch

MiB = 1 << 20


def main() -> None:
    print("torch", torch.__version__, torch.cuda.get_device_name())
    stream = torch.cuda.Stream()
    a, b = torch.randn(64, 1 << 16, device="cuda"), torch.randn(1 << 16, 64, device="cuda")
    out = torch.empty(64, 64, device="cuda")
    torch.mm(a, b, out=out)  # the current stream's own workspace, before anything is read
    torch.cuda.synchronize()

    def capture():
        g = torch.cuda.CUDAGraph()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            g.capture_begin()
            torch.mm(a, b, out=out)
            g.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        return g

    held = [torch.cuda.memory_allocated()]
    g1 = capture()
    held.append(torch.cuda.memory_allocated())
    g2 = capture()
    held.append(torch.cuda.memory_allocated())
    del g1
    gc.collect()
    held.append(torch.cuda.memory_allocated())
    g3 = capture()
    held.append(torch.cuda.memory_allocated())
    d = [(y - x) / MiB for x, y in zip(held, held[1:])]
    print("MiB: first capture %+.1f, second %+.1f, first graph destroyed %+.1f, third capture %+.1f" % tuple(d))
    print("destroying a graph drops its stream's workspace:", d[2] < -1)
    del g2, g3


if __name__ == "__main__":
    main()
