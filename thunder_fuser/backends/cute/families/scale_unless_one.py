"""``x *= g`` in place, where ``g`` is a one-element tensor on the device (a loss's
cotangent), skipped on the device when ``g`` is exactly one: the backward of the two-pass
cross-entropy (``rules/cross_entropy.py``), whose forward already wrote the gradient of a
summed or averaged loss for a cotangent of one.

A training step's cotangent is one (``loss.backward()``) unless the loss is scaled (gradient
accumulation, a loss scaler), and only the device knows it. Reading it on the host would
stop the host at every step until the forward has finished (Liger-Kernel's ``torch.equal``
does), so the kernel reads it: a grid of a few blocks per SM (a grid-stride loop), each of
which returns at once on a one, so the skipped backward costs one launch. Otherwise each
thread scales 16-byte vectors of the flat tensor; a ragged tail (fewer than a vector's
elements) is a second launch of the same kernel over one element per vector. The kernel
reads the cotangent in its own dtype (a bf16 model's loss is bf16): converting it first
would be a torch kernel and an allocation every training step.
"""


import torch

from thunder_fuser.backends.cute import cache

THREADS = 256
BLOCKS_PER_SM = 4


def scale_unless_one_(x: torch.Tensor, g: torch.Tensor, use_kernel: bool) -> torch.Tensor:
    """``x`` scaled in place by ``g`` (a one-element tensor: the loss's cotangent), unless
    ``g`` is one; ``x`` itself. ``use_kernel``: a CuTe kernel decides on the device; otherwise a tensor on
    the CPU decides on the host, and one elsewhere is always multiplied (no host sync)."""
    if x.numel() == 0:
        return x
    if not use_kernel or not x.is_contiguous():
        if x.device.type != "cpu" or g.item() != 1.0:
            wide = torch.float64 if x.dtype == torch.float64 else torch.float32  # as the kernel: one rounding
            x.copy_(x.to(wide) * g.to(wide))
        return x
    g = g.reshape(1)
    if g.dtype not in COTANGENT_DTYPES:
        g = g.float()
    n = x.numel()
    v = 16 // x.element_size()
    whole = n // v * v
    main = _launcher(x.dtype, g.dtype, v, x.device) if whole else None
    tail = _launcher(x.dtype, g.dtype, 1, x.device) if whole < n else None
    if (whole and main is None) or (whole < n and tail is None):
        # a worker compiles the kernel (the first step, cold cache): torch multiplies, one
        # rounding as the kernel's, by one too (exact), so the host still never waits
        return x.mul_(g)
    if whole:
        fn, blocks = main
        fn(x.view(-1, v) if whole == n else x.view(-1)[:whole].view(-1, v), g, blocks)
    if whole < n:
        fn, _ = tail
        fn(x.view(-1)[whole:].view(-1, 1), g, 1)
    return x


COTANGENT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)  # read as they are
_launchers: dict = {}  # (dtype, cotangent dtype, vector, device) -> (compiled function, blocks): one lookup a call
_queued: set = set()  # the same keys, once queued for a compile worker


def _cache_key(dtype: torch.dtype, gdtype: torch.dtype, v: int, arch: str) -> tuple:
    return ("scale_unless_one v2", str(dtype), str(gdtype), v, arch)


def compile_into(dtype: torch.dtype, gdtype: torch.dtype, v: int, arch: str, directory=None):
    """The launch function: from memory, from the disk cache, or compiled into it (in a
    compile worker, ``directory`` is where the caller reads)."""
    return cache.get_or_compile(_cache_key(dtype, gdtype, v, arch), lambda: build(dtype, v, arch, gdtype), directory)


def _launcher(dtype: torch.dtype, gdtype: torch.dtype, v: int, device) -> tuple | None:
    """(launch function, blocks), or None the first time where a compile worker takes the
    kernel (``compile_workers.submit``). Compiled here, it was the only kernel pythia's
    cold first step compiled in the training process, and so that process's first CuTe DSL
    compile, start-up included: pythia's cold first step took 9.04 and 8.21 s with it, 5.89
    and 6.58 s without (fresh processes taking turns, one H100 host)."""
    key = (dtype, gdtype, v, device)
    hit = _launchers.get(key)
    if hit is None:
        from thunder_fuser.backends.cute import compile_workers
        from thunder_fuser.backends.cute.backend import arch_of

        arch = arch_of(device)
        digest = cache.key_digest(_cache_key(dtype, gdtype, v, arch))
        if key not in _queued:
            _queued.add(key)
            if compile_workers.submit(digest, lambda: (__name__, "compile_into", (dtype, gdtype, v, arch)), arch):
                return None
        compile_workers.wait(digest)
        fn = compile_into(dtype, gdtype, v, arch)
        hit = _launchers[key] = (fn, torch.cuda.get_device_properties(device).multi_processor_count * BLOCKS_PER_SM)
    return hit


def build(dtype: torch.dtype, v: int, arch: str, gdtype: torch.dtype = torch.float32):
    """The compiled launch ``fn(x, g, blocks)`` for ``x`` of shape ``[n, v]`` (rows of one
    16-byte vector where ``v`` fills one, 16-byte aligned) and ``g`` of shape ``[1]`` and
    dtype ``gdtype``, compared with one in fp32 (fp64 for an fp64 ``g``: exact either way)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    from thunder_fuser.backends.cute.dsl.cute_values import cute_dtype
    from thunder_fuser.backends.cute.backend import compile_options

    wide = cutlass.Float64 if dtype == torch.float64 else cutlass.Float32  # what the product is taken in
    gwide = cutlass.Float64 if gdtype == torch.float64 else cutlass.Float32  # what g is compared in

    @cute.kernel
    def kernel(x: cute.Tensor, g: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        s = g[0].to(gwide)
        if s != gwide(1.0):
            for i in cutlass.range(bidx * THREADS + tidx, cute.size(x, mode=[0]), gdim * THREADS):
                row = x[i, None]
                row.store((row.load().to(wide) * s.to(wide)).to(x.element_type))

    @cute.jit
    def launch(x: cute.Tensor, g: cute.Tensor, blocks: cutlass.Int32, stream):
        kernel(x, g).launch(grid=(blocks, 1, 1), block=(THREADS, 1, 1), stream=stream)

    fake_x = make_fake_tensor(cute_dtype(dtype), (cute.sym_int32(), v), (v, 1), assumed_align=16 if v > 1 else None)
    fake_g = make_fake_tensor(cute_dtype(gdtype), (1,), (1,), assumed_align=gdtype.itemsize)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(launch, fake_x, fake_g, 0, stream, options=compile_options(arch))
