"""Generated CuTe DSL kernels against eager on the GPU (marked ``cuda``; skipped without one).

Every fresh output starts as NaN (``segment_kernel.FILL_NAN``), so an element a kernel fails
to write fails the comparison. Each test also asserts which segments ran a kernel: a
silent fallback to the reference backend would otherwise pass unnoticed.
"""

import warnings

import pytest
import thunder
import torch

from benchmarks.workloads import adam_step, gelu_bias, layernorm, rmsnorm, rope, rotate_half_residual, softmax
from helpers import (
    CREATION_CASES, STAGED_REDUCTIONS, causal_attention, causal_mask_scores,
    check_a_misaligned_call_runs_a_shared_launch_apart, check_batch_norm_backward, check_gradients,
    check_layernorm_backward, check_norm_backward, check_vs_eager, check_vs_float64,
    integer_division, plans, rope_from_one_projection, signed_operands, three_shapes, TWO_LEVEL_RESIZES,
)
from thunder_fuser import fuser_ex
from thunder_fuser.backends.cute import segment_kernel
from thunder_fuser.backends.cute.backend import KernelFallbackWarning

pytestmark = pytest.mark.cuda
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(segment_kernel, "FILL_NAN", True)


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def run_without_fallback(fn, *args, check=check_vs_eager):
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        return check(fn, *args)


def reduce_without_fallback(fn, *args):
    """Long reductions: compared with a float64 evaluation, beside eager's own error."""
    return run_without_fallback(fn, *args, check=check_vs_float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4096, 4097, 8])
def test_pointwise_with_broadcast_bias(dtype, n):
    run_without_fallback(gelu_bias, _randn(33, n, dtype=dtype), _randn(n, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [4097, 4103, 9])
def test_pointwise_ragged_1d_tail(dtype, n):
    """1-D, so the last vector is partial and moves element by element."""
    run_without_fallback(lambda a, b: torch.exp(a) * 2 + b, _randn(n, dtype=dtype), _randn(n, dtype=dtype))


@pytest.mark.parametrize("n", [4097, 6])
def test_a_ragged_bool_mask(n):
    """A bool operand's ragged tail is read element by element (each element converted: it
    reads as Int8)."""
    run_without_fallback(lambda m, x: torch.where(m, 2.0, x) + 1, _randn(n) > 0, _randn(n))


WHERE_MIXES = {  # condition, then branches: a vector, a row's value or a constant
    "vector; constant, constant": lambda x: torch.where(x > 0, 1.0, -0.5),
    "vector; vector, constant": lambda x: torch.where(x > 0, x, 0.0),
    "vector; constant, row": lambda x: torch.where(x > 0, 0.0, x.amax(-1, keepdim=True)),
    "row; vector, constant": lambda x: torch.where(x.amax(-1, keepdim=True) > 0, x, 0.0),
    # times x.float(): thunder's decomposition of where(c, 1.0, 2.0) * x rounds to x's dtype,
    # where torch (and thunder's torch executor) return fp32
    "row; constant, constant": lambda x: torch.where(x.sum(-1, keepdim=True) > 0, 1.0, 2.0) * x.float(),
    "row; constant, row (log_softmax)": lambda x: torch.log_softmax(x.float(), -1),
    "row; constant, row (logsumexp)": lambda x: torch.logsumexp(x.float(), -1),
    "row; row, row": lambda x: torch.where(x.sum(-1, keepdim=True) > 0, x.amax(-1, keepdim=True), x.amin(-1, keepdim=True)) + x,
}


@pytest.mark.parametrize("dtype", DTYPES[:2])
@pytest.mark.parametrize("n", [1000, 40000])
@pytest.mark.parametrize("mix", WHERE_MIXES)
def test_where_over_vectors_row_values_and_constants(mix, n, dtype):
    """torch.where of any mix: log_softmax and logsumexp (whose where(|max| == inf, 0.0,
    max) is a row's condition, a constant and a row's value) fell back before session 15
    (cute.where takes a vector condition and at least one vector branch); rows in
    registers and too long for registers."""
    run_without_fallback(WHERE_MIXES[mix], _randn(7, n, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pointwise_input_whose_fastest_dim_differs_and_casts(dtype):
    def f(a, b, c):
        return (a.float() * b + torch.exp(c)).to(dtype), (a > 0).to(torch.float32) * c

    a = _randn(300, 257, dtype=dtype).t()  # [257, 300], fastest dim 0
    b = _randn(257, 1)  # broadcast along dim 1
    c = _randn(257, 300)
    run_without_fallback(f, a, b, c)


def _staged(jfn) -> list:
    """Per kernel program of ``jfn``: (the staged mode, how many operands it stages), or ()
    where nothing is staged; no segment on the reference backend."""
    ps = plans(thunder.last_traces(jfn)[-1])
    assert not any(p.decision.fallbacks for p in ps), [p.decision.fallbacks for p in ps]
    return [part.geo.stage and (part.geo.stage[0], len(part.geo.stage[1]))
            for p in ps for k in p.kernels.values() if k for part in k.parts]


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_operands_staged_through_shared_memory(dtype):
    """Operands contiguous along another dim than the output's go through shared-memory
    tiles (``pointwise_geometry.transpose_stage``): ragged tiles along both dims, two staged
    operands, vectors of one element (an odd N), a staged operand narrower than the output (fp32 vectors of 4 over bf16
    tiles), a slice of a transposed tensor (an offset), the staged mode outer of another
    outer mode (beside an operand broadcast along that one), and a gathered mode too short
    to stage beside a staged one."""
    x, y = _randn(300, 520, dtype=dtype), _randn(520, 300, dtype=dtype)
    jfn, _ = run_without_fallback(lambda x, y: torch.exp(x) + y.t() * 2, x, y)
    assert _staged(jfn) == [(0, 1)]
    jfn, _ = run_without_fallback(lambda x, y, z: x + y.t() * z.t(), x, y, _randn(520, 300, dtype=dtype))
    assert _staged(jfn) == [(0, 2)]
    jfn, _ = run_without_fallback(lambda x, y: x.float() * y.t(), x, _randn(520, 300))
    assert _staged(jfn) == [(0, 1)]
    jfn, _ = run_without_fallback(lambda x, y: x + y.t(), _randn(300, 517, dtype=dtype), _randn(517, 300, dtype=dtype))
    assert _staged(jfn) == [(0, 1)]  # an odd row: vectors of one element, a tile row of 128 bytes still
    jfn, _ = run_without_fallback(lambda x, y: x + y[3:515, 1:-3].t(), _randn(296, 512, dtype=dtype), y)
    assert _staged(jfn) == [(0, 1)]
    a, b, c = _randn(70, 5, 48, dtype=dtype), _randn(5, 48, 70, dtype=dtype), _randn(70, 1, 48, dtype=dtype)
    jfn, _ = run_without_fallback(lambda a, b, c: a - b.permute(2, 0, 1) * c, a, b, c)  # b: fastest along dim 0
    assert _staged(jfn) == [(1, 1)]
    jfn, _ = run_without_fallback(lambda a, b, c: a * b.transpose(1, 2) + c.transpose(0, 2), _randn(3, 70, 48, dtype=dtype),
                                  _randn(3, 48, 70, dtype=dtype), _randn(48, 70, 3, dtype=dtype))
    assert _staged(jfn) == [(0, 1)]  # c, contiguous along the 3 batches, stays gathered


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_reductions_read_transposed_operands_from_a_staged_copy(dtype):
    """A row reduction of x + y.t() copies y.t() into the rows' order through shared-memory
    tiles first (``expr.transpose_first``), then reads the copy in vectors: softmax, layer
    norm and sums, ragged tiles, an odd row, rows over a batch dim, and split rows."""
    x, y = _randn(300, 520, dtype=dtype), _randn(520, 300, dtype=dtype)
    for fn in (lambda x, y: torch.softmax(x + y.t(), -1), lambda x, y: (x * y.t()).sum(-1),
               lambda x, y: torch.nn.functional.layer_norm(x * y.t(), (520,))):
        jfn, _ = run_without_fallback(fn, x, y)
        assert _staged(jfn) == [(0, 1), ()]
    jfn, _ = run_without_fallback(lambda x, y: torch.softmax(x - y.t(), -1), _randn(300, 517, dtype=dtype),
                                  _randn(517, 300, dtype=dtype))
    assert _staged(jfn) == [(0, 1), ()]
    jfn, _ = run_without_fallback(lambda a, b: torch.softmax(a * b.transpose(1, 2), -1), _randn(3, 70, 48, dtype=dtype),
                                  _randn(3, 48, 70, dtype=dtype))
    assert _staged(jfn) == [(0, 1), ()]
    jfn, _ = reduce_without_fallback(lambda x, y: (x + y.t()).sum(-1), _randn(32, 2**18, dtype=dtype),
                                     _randn(2**18, 32, dtype=dtype))
    assert _staged(jfn) == [(0, 1), ()] and _split_row_launches(jfn) == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [128, 4096, 4097, 16384])
def test_row_kernels(dtype, n):
    x, w, b = _randn(37, n, dtype=dtype), _randn(n, dtype=dtype), _randn(n, dtype=dtype)
    run_without_fallback(softmax, x)
    run_without_fallback(rmsnorm, x, w)
    run_without_fallback(layernorm, x, w, b)


def test_row_reductions_sum_max_min_mean_var_prod():
    def f(x):
        return x.sum(-1), x.amax(-1), x.amin(-1), x.mean(-1, keepdim=True), x.var(-1), (1 + 0.01 * x).prod(-1)

    run_without_fallback(f, _randn(65, 1000))
    run_without_fallback(f, _randn(3, 5, 77).transpose(0, 1))


def test_layernorm_backward_on_kernels():
    """Row reductions (dx) and column reductions (dw, db) beside full-domain stores."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        check_layernorm_backward("cuda", (64, 4096), require_kernels=True)
        check_layernorm_backward("cuda", (1000, 4097), require_kernels=True)


IN_THE_ROW_KERNEL = "takes its sums per column in its row kernel"
APART = "takes its sums per column in a reduction of their own after its rows"


@pytest.mark.parametrize("shape, dtype, expect", [
    ((37, 1000), torch.float32, IN_THE_ROW_KERNEL),  # blocks of 64 threads per row, fewer row blocks than blocks
    ((2, 19, 256), torch.bfloat16, IN_THE_ROW_KERNEL),  # rows of one warp, 4 per block: slots added in shared memory
    ((1000, 4097), torch.float32, IN_THE_ROW_KERNEL),  # odd rows: scalar accesses
    ((4099, 1024), torch.float16, IN_THE_ROW_KERNEL),  # several row blocks per block, the last one ragged
    ((8, 1024, 1024), torch.bfloat16, IN_THE_ROW_KERNEL),  # a transformer block's layer norm backward
    ((16384, 4096), torch.bfloat16, IN_THE_ROW_KERNEL),  # an RMSNorm's, 4096 wide
    ((4096, 4096), torch.bfloat16, IN_THE_ROW_KERNEL),  # square: the weight has a row statistic's shape
    ((300, 16384), torch.bfloat16, IN_THE_ROW_KERNEL),  # 512 threads of 4 vectors: 64 registers for the two sums
    ((300, 20480), torch.bfloat16, APART),  # too many registers for the two sums (80)
    ((96, 64), torch.float32, APART + " (its rows do not run as one row kernel"),  # rows strided (transposed)
])
def test_norm_backward_sums_per_column(shape, dtype, expect):
    """A norm backward's input gradient with its weight and bias gradients (sums over the
    rows, in the row kernel or apart), against float64; every output starts as NaN."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        check_norm_backward(shape, dtype, "cuda", expect, transposed=shape == (96, 64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_reductions(dtype):
    """Reduced dims outer in memory: split over blocks, partials combined by a second launch."""

    def f(x):
        return x.sum(0), x.amax(0), x.amin(0), x.mean(0, keepdim=True), (1 + 0.01 * x).prod(0), x.var(0)

    reduce_without_fallback(f, _randn(3000, 4096, dtype=dtype))
    reduce_without_fallback(f, _randn(7, 33, dtype=dtype))  # fewer rows than row groups; ragged columns
    reduce_without_fallback(lambda x: x.sum((0, 1)), _randn(16, 512, 1000, dtype=dtype))
    # var (Welford) with a large mean, where a sum-of-squares formula would cancel
    reduce_without_fallback(lambda x: torch.var_mean(x, (0, 1)), 1000 + _randn(64, 300, 256, dtype=dtype))
    # a reduction inside another's argument: the max, then the sum of exp(x - max), then the division
    run_without_fallback(lambda x: torch.softmax(x, 0), _randn(3000, 257, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_division_by_a_constant_is_eagers_to_the_bit(dtype):
    """Eager CUDA divides by a scalar as a multiply by its fp32 reciprocal; the kernels
    multiply by the same reciprocal, so the results are equal, not just close."""
    x = _randn(33, 4097, dtype=dtype)
    f = thunder.jit(lambda x: (x / 1.4142135623730951, x / 3.0, x / -7.5), executors=[fuser_ex])
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        got = f(x)
    assert not any(p.decision.fallbacks for p in plans(thunder.last_traces(f)[-1]))
    for g, want in zip(got, (x / 1.4142135623730951, x / 3.0, x / -7.5)):
        torch.testing.assert_close(g, want, atol=0, rtol=0)


def _split_row_launches(jfn) -> int:
    """Programs of ``jfn`` whose rows split across blocks; no segment on the reference backend."""
    ps = plans(thunder.last_traces(jfn)[-1])
    assert not any(p.decision.fallbacks for p in ps), [p.decision.fallbacks for p in ps]
    return sum(part.geo.split_rows for p in ps for k in p.kernels.values() if k for part in k.parts)


@pytest.mark.parametrize("dtype", DTYPES)
def test_few_long_rows_split_across_blocks(dtype):
    """A few long rows (``rows_geometry.SPLIT_MIN``): each row split across blocks, the
    splits' partials combined by a second launch. Every reduction with a full-domain store
    on the way; var (Chan's merges) with a large mean; a layer norm (the statistics split,
    then a pointwise pass); whole-tensor reductions (a loss, a norm written out: thunder runs
    ``torch.linalg.vector_norm`` as one torch call), one of an odd length (scalar accesses);
    rows over two outer dims; a gathered operand; softmax and log_softmax (their max
    first, then their sum of exp(x - max), then the division)."""
    n = 2**20 + 24  # splits of unequal length
    jfn, _ = reduce_without_fallback(
        lambda x: (x.sum(-1), x.amax(-1), x.amin(-1), x.mean(-1, keepdim=True), x.var(-1), x * 2), _randn(3, n, dtype=dtype))
    assert _split_row_launches(jfn) == 1
    jfn, _ = reduce_without_fallback(lambda x: (1 + 1e-3 * x).prod(-1), _randn(2, n, dtype=dtype))
    assert _split_row_launches(jfn) == 1
    jfn, _ = reduce_without_fallback(lambda x: torch.var_mean(x, -1), 1000 + _randn(2, n, dtype=dtype))
    assert _split_row_launches(jfn) == 1
    jfn, _ = reduce_without_fallback(lambda x, w: torch.nn.functional.layer_norm(x, (n,), w), _randn(4, n, dtype=dtype),
                                     _randn(n, dtype=dtype))
    assert _split_row_launches(jfn) == 1
    for shape in [(4096, 1024), (3, 1001, 999)]:
        jfn, _ = reduce_without_fallback(torch.nn.functional.mse_loss, _randn(*shape, dtype=dtype), _randn(*shape, dtype=dtype))
        assert _split_row_launches(jfn) == 1
    jfn, _ = reduce_without_fallback(lambda x: x.float().square().sum().sqrt(), _randn(2**22, dtype=dtype))
    assert _split_row_launches(jfn) == 1
    jfn, _ = reduce_without_fallback(lambda x: x.sum(-1), _randn(2, 3, 2**19, dtype=dtype))
    assert _split_row_launches(jfn) == 1
    jfn, _ = reduce_without_fallback(lambda x, y: (x + y.t()).sum(-1), _randn(4, 2**19, dtype=dtype),
                                     _randn(2**19, 4, dtype=dtype))
    assert _split_row_launches(jfn) == 1
    jfn, _ = run_without_fallback(lambda x: (torch.softmax(x, -1), torch.log_softmax(x, -1)), _randn(2, n, dtype=dtype))
    assert _split_row_launches(jfn) >= 2  # the max, then the sum of exp(x - max), then the division


@pytest.mark.parametrize("dtype", DTYPES)
def test_channels_last_batch_norm(dtype):
    """Column statistics (one kernel), then the normalization (a second), running stats
    updated in place."""

    def f(x, w, b, rm, rv):
        return torch.nn.functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)

    x = _randn(32, 64, 28, 28, dtype=dtype).to(memory_format=torch.channels_last)
    w, b, rm, rv = (_randn(64, dtype=dtype) for _ in range(4))
    run_without_fallback(f, x, w, b, rm, rv.abs())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", STAGED_REDUCTIONS)
def test_reduced_dims_runs_apart_reduce_in_two_stages(name, dtype):
    """Two row kernels (partials over the innermost run, then over the rest), at the CPU
    test's shapes with every reduced dim 4 times as long (each case keeps dim 1)."""
    fn, shape = STAGED_REDUCTIONS[name]
    x = _randn(*(s if d == 1 else s * 4 for d, s in enumerate(shape)), dtype=dtype)
    run_without_fallback(fn, x, check=check_vs_float64)


def test_nchw_batch_norm_forward_and_backward():
    """NCHW: its statistics and its gradients' sums over N, H and W reduce in two stages."""
    check_batch_norm_backward("cuda", (32, 64, 28, 28), atol=1e-3, memory_format=torch.contiguous_format)


def test_channels_last_batch_norm_backward():
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        check_batch_norm_backward("cuda", (32, 64, 28, 28))


def test_gelu_bias_backward_785():
    from benchmarks.workloads import GELU_SCALARS, gelu_bias_backward

    t = [_randn(4, 512, 4096) for _ in range(3)]
    reduce_without_fallback(gelu_bias_backward, *t, *GELU_SCALARS)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_too_long_for_registers(dtype):
    """Rows past the persistent kernel's register budget re-read the row once per reduction."""
    n = 1024 * 8 * 8 * 2 + 8  # more vectors than 1024 threads x 8 each hold, at every dtype
    x, w, b = _randn(5, n, dtype=dtype), _randn(n, dtype=dtype), _randn(n, dtype=dtype)
    run_without_fallback(softmax, x)
    run_without_fallback(layernorm, x, w, b)
    reduce_without_fallback(lambda x: (x.sum(-1), x.amax(-1), x.var(-1)), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_looped_rows_with_cache_hints(dtype):
    """Rows of 128 KiB and more, whose last pass marks its loads of the row last use and
    streams its stores (``rows_geometry.LOOP_LAST_USE_BYTES``; which accesses carry the hints is
    the PTX test's check in test_kernels.py): results right, weights and biases included."""
    n = 65536
    x, w, b = _randn(80, n, dtype=dtype), _randn(n, dtype=dtype), _randn(n, dtype=dtype)
    for fn, args in ((layernorm, (x, w, b)), (softmax, (x,)), (lambda x: torch.log_softmax(x.float(), -1), (x,))):
        jfn, _ = run_without_fallback(fn, *args)
        assert [g.last_use for g in _row_geometries(jfn)] == [True]


def _row_geometries(jfn) -> list:
    return [part.geo for p in plans(thunder.last_traces(jfn)[-1]) for k in p.kernels.values() if k for part in k.parts]


def _looped_rows(jfn) -> list:
    """Per row program of ``jfn``: whether its rows loop (too long for registers, not split)."""
    return [g.looped for g in _row_geometries(jfn)]


def _special_rows(x: torch.Tensor, inf: bool) -> torch.Tensor:
    """``x`` with rows an online softmax must get right: -inf entries (a mask), all -inf, a
    +inf entry (where ``inf``), a NaN, values away from zero, and values rising along the
    row (the running max grows at every step). The offsets stay near 30: thunder's
    log_softmax adds log(sum) to the max before it subtracts, which rounds at the max's
    magnitude (3000 moved fp32 results by 1e-4, past the tolerance, on the reference
    backend too)."""
    x = x.clone()
    x[1, ::3] = -torch.inf
    x[2] = -torch.inf
    if inf:
        x[3, 77] = torch.inf
    x[4, 5] = torch.nan
    x[5] += 30
    x[6] -= 30
    x[7] = torch.linspace(-20, 20, x.shape[1], device=x.device)
    x[8, -1] = 50  # the max in the last vector, past every other
    x[9, 0] = 50  # the max in the first (of a row of odd length: its edge vector, shared with row 8)
    return x


ONLINE_SOFTMAXES = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x.float(), -1),
    "logsumexp": lambda x: torch.logsumexp(x.float(), -1),
}


@pytest.mark.parametrize("dtype", DTYPES[:2])
@pytest.mark.parametrize("n", [30000, 30001, 50257])
@pytest.mark.parametrize("name", ONLINE_SOFTMAXES)
def test_online_softmax_over_rows_too_long_for_registers(name, n, dtype):
    """Rows past the register budget (``rows_geometry.REGISTER_ROW_ELEMENTS``) and too many to
    split take the max and the sum of exp(x - max) in one pass (``expr.softmax_sums``): on
    random rows against float64, and on rows of infinities, a NaN, large offsets and a
    rising max against eager; ragged (30001) and odd (50257: vectors of one element). A
    +inf entry makes log_softmax NaN along its row, as eager's (``passes/eager_decompositions.py``:
    thunder's decomposition gave NaN there and -inf elsewhere)."""
    fn = ONLINE_SOFTMAXES[name]
    jfn, _ = reduce_without_fallback(fn, _randn(80, n, dtype=dtype))
    assert _looped_rows(jfn) == [True], _looped_rows(jfn)
    jfn, _ = run_without_fallback(fn, _special_rows(_randn(80, n, dtype=dtype), inf=True))
    assert _looped_rows(jfn) == [True], _looped_rows(jfn)
    if name == "log_softmax":
        row = jfn(_special_rows(_randn(80, n, dtype=dtype), inf=True))[3]
        assert row.isnan().all(), row


FLAT_ROWS = {  # arguments named w and b run along the rows (a weight, a bias); the others are rows
    **ONLINE_SOFTMAXES,
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]),
    "layer_norm with weight and bias": lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b),
    "softmax backward": lambda y, g: y * (g - (g * y).sum(-1, keepdim=True)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(81, 50257), (40, 3, 24577), (81, 4097), (40, 3, 197), (1001, 97), (1001, 33),
                                   (200, 16385)])
@pytest.mark.parametrize("name", FLAT_ROWS)
def test_rows_of_odd_length_walk_whole_vectors(name, shape, dtype):
    """Rows of odd length, back to back, too long for registers (the first two shapes) or
    held in them: whole vectors of the flat run, each row's first and last vector (shared
    with its neighbours) element by element, and a weight and a bias element by element
    (``geometry.flat_rows``). 81 * 50257 elements end inside the last vector; the rows of
    [40, 3, n] merge into one mode; rows of 97 and 33 take the flat run over 4 threads each
    (``rows_geometry.FLAT_MIN_VECTORS``; log_softmax's fp32 results of 16-bit rows in vectors of
    4, ``geometry.vector_width``); rows of 16385 over 512 threads (in vectors of one element
    they were looped).
    Against float64, then rows of infinities, NaNs and maxima in the first and last
    elements against eager."""
    fn = FLAT_ROWS[name]
    code = fn.__code__
    args = [_randn(*(shape[-1:] if a in "wb" else shape), dtype=dtype) for a in code.co_varnames[:code.co_argcount]]
    jfn, _ = reduce_without_fallback(fn, *args)
    assert [(g.flat, g.vector > 1) for g in _row_geometries(jfn)] == [(True, True)]
    if name in ONLINE_SOFTMAXES and shape[-1] > 77:  # _special_rows writes element 77
        run_without_fallback(fn, _special_rows(args[0].view(-1, shape[-1]), inf=name != "log_softmax"))


FLAT_POINTWISE = {  # name -> (fn, input maker(dtype))
    "gelu(x + bias), 33 * 4097 ending inside the last vector": (
        gelu_bias, lambda dt: (_randn(33, 4097, dtype=dt), _randn(4097, dtype=dt))),
    "a misaligned bias": (
        lambda x, b: x * 2 + b, lambda dt: (_randn(33, 4097, dtype=dt), _randn(4098, dtype=dt)[1:])),
    "a value per row and a bias, outer dims merged": (
        lambda x, s, b: x * s + b, lambda dt: (_randn(7, 5, 4099, dtype=dt), _randn(7, 5, 1, dtype=dt), _randn(4099, dtype=dt))),
    "rows of 9: vectors span rows": (
        lambda x, b: x + b, lambda dt: (_randn(1001, 9, dtype=dt), _randn(9, dtype=dt))),
    "a bool mask": (
        lambda m, x: torch.where(m, x, 0.0), lambda dt: (_randn(1001, 9) > 0, _randn(9, dtype=dt))),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", FLAT_POINTWISE)
def test_pointwise_over_rows_of_odd_length_moves_whole_vectors(name, dtype):
    """Rows of odd length that cannot merge into one dim: vectors of their flat run, which
    may span two rows; the other operands element by element (``geometry.flat_rows``)."""
    fn, make = FLAT_POINTWISE[name]
    jfn, _ = run_without_fallback(fn, *make(dtype))
    assert [(g.flat, g.vector > 1) for g in _row_geometries(jfn)] == [(True, True)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_resize_rotate_half_and_rope(dtype):
    run_without_fallback(rotate_half_residual, _randn(2, 4, 33, 128, dtype=dtype))
    q = _randn(2, 64, 32, 128, dtype=dtype).transpose(1, 2)  # [b, h, s, d] laid out as [b, s, h, d]
    k = _randn(2, 64, 8, 128, dtype=dtype).transpose(1, 2)
    jfn, _ = run_without_fallback(rope, q, k, _randn(64, 128, dtype=dtype), _randn(64, 128, dtype=dtype))
    (plan,) = plans(thunder.last_traces(jfn)[-1])
    assert plan.groups[0] is not None and plan.groups[0].fn is not None, plan.decision.apart  # q and k: one launch
    assert all(p.fn is None for p in plan.groups[0].parts)  # their own launches are never compiled


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("c_shape", [(7, 64), (5, 1, 64), (3, 1, 7, 64), (3, 5, 7, 1)])
def test_broadcast_operand_read_once_for_several_rows(dtype, c_shape):
    """A thread walks 2 rows along the mode where ``c`` is broadcast (outermost, innermost
    or middle outer mode, or the vector dim); 15, 7, 5 and 3 rows leave a partial group."""
    run_without_fallback(lambda x, c: x * c + 1, _randn(3, 5, 7, 64, dtype=dtype), _randn(*c_shape, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_independent_segments_of_three_shapes_share_one_launch(dtype):
    """A ragged 1-D tail, a bias read once for 2 rows and an outer-dim cat, one launch."""
    args = (_randn(4097, dtype=dtype), _randn(33, 256, dtype=dtype), _randn(256, dtype=dtype),
            _randn(5, 4097, dtype=dtype), _randn(3, 4097, dtype=dtype))
    jfn, _ = run_without_fallback(three_shapes, *args)
    (plan,) = plans(thunder.last_traces(jfn)[-1])
    assert len(plan.groups[0].parts) == 3 and plan.groups[0].fn is not None, plan.decision.apart


def test_an_optimizer_steps_in_place_updates_share_launches():
    """torch's foreach AdamW as it runs compiled (step counters on the device), bf16: each
    parameter's update a segment of its own, the updates (and the counters) one launch a
    step, every tensor written in place as eager writes it (``segment/chains.py``)."""
    from test_kernels import _foreach_adamw

    shapes = ((512, 256), (256, 512), (1 << 20,), (3000,), (96,))

    def t():
        return [_randn(*s, dtype=torch.bfloat16) for s in shapes]

    steps = [torch.tensor(float(i), device="cuda") for i in range(len(shapes))]
    jfn, _ = run_without_fallback(_foreach_adamw, t(), t(), t(), [v.abs() for v in t()], steps)
    (plan,) = plans(thunder.last_traces(jfn)[-1])
    groups = [g for g in plan.groups.values() if g is not None]
    assert plan.decision.apart == {} and groups and all(g.fn is not None for g in groups)
    assert sum(len(g.parts) for g in groups) == len(plan.decision.segments) == 2 * len(shapes)


def test_a_misaligned_call_runs_a_shared_launch_apart():
    """The members' own kernels are compiled on demand for that call (a group member's are not at first)."""
    check_a_misaligned_call_runs_a_shared_launch_apart(_randn)


def test_slice_cat_pad_innermost():
    def f(x, y):
        z = torch.cat((x[..., 2:10], y, x[..., :4]), -1) * 2
        return z, torch.nn.functional.pad(x * 2, (4, 4), value=1.5)

    run_without_fallback(f, _randn(7, 16), _randn(7, 4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat_and_pad_along_outer_dims(dtype):
    """The piece is picked per row; each piece reads its rows shifted along the cat dim."""

    def f(x, y):
        return torch.cat((x.exp(), y), 1) * 2, torch.nn.functional.pad(x, (0, 0, 3, 2), value=1.5)

    run_without_fallback(f, _randn(4, 33, 256, dtype=dtype), _randn(4, 17, 256, dtype=dtype))
    run_without_fallback(lambda a, b: torch.cat((a, b), 0) + 1, _randn(5, 4097, dtype=dtype), _randn(3, 4097, dtype=dtype))
    # the output's fastest dim is dim 0 (inputs transposed): dim 1 is an outer dim
    run_without_fallback(lambda a, b: torch.cat((a, b), 1) + 1, _randn(40, 64, dtype=dtype).t(), _randn(24, 64, dtype=dtype).t())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", TWO_LEVEL_RESIZES)
def test_pieces_shifted_along_two_dims_or_twice_along_one(name, dtype):
    """Pad of H and W, pad of a cat, cat of pads, one tensor as two pieces."""
    fn, shapes = TWO_LEVEL_RESIZES[name]
    run_without_fallback(fn, *[_randn(*s, dtype=dtype) for s in shapes])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CREATION_CASES)
def test_iota_and_full_in_kernels(name, dtype):
    """iota read as a plan-built operand, full as a number; bool and int64 loads, bool stores."""
    fn, shapes = CREATION_CASES[name]
    run_without_fallback(fn, *[_randn(*s, dtype=dtype) for s in shapes])


@pytest.mark.parametrize("n", [1000, 4097])
def test_causal_softmax_rows(n):
    run_without_fallback(lambda s: torch.softmax(causal_mask_scores(s), -1), _randn(1, 2, n, n, dtype=torch.bfloat16))


def test_causal_attention_forward_and_backward_on_kernels():
    """Without sdpa_ex thunder decomposes causal SDPA: every fuser segment, forward and
    backward, runs a kernel."""
    q, k, v = (_randn(2, 8, 256, 64) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        check_gradients(causal_attention, q, [k, v], atol=1e-3, require_kernels=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_division_truncates_and_floors(dtype):
    run_without_fallback(integer_division, *signed_operands((33, 4097), dtype, "cuda"))


def test_copy_to_out_writes_in_place():
    args = [[_randn(s) for s in [(4097,), (64, 129)]] for _ in range(4)]
    args[3] = [a.abs() for a in args[3]]
    run_without_fallback(adam_step, *args)


def test_tanh_rounded_to_bf16_is_within_one_ulp():
    """A tanh whose result is rounded to bf16 at once runs as tanh.approx.f32: at most one
    bf16 ulp from eager's exact tanh, anywhere on its range."""

    def f(x):
        return torch.tanh(x.float()).to(torch.bfloat16)

    x = torch.linspace(-12, 12, 1 << 20, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        got = thunder.jit(f, executors=[fuser_ex])(x)
    want = f(x)
    w = want.float()
    _, exponent = torch.frexp(w)  # w = m * 2**exponent, 0.5 <= |m| < 1
    ulp = torch.ldexp(torch.full_like(w, torch.finfo(torch.bfloat16).eps), exponent - 1)
    ulp = ulp.clamp_min(torch.finfo(torch.bfloat16).tiny)
    assert ((got.float() - w).abs() <= ulp).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_arithmetic_matches_eager_bit_for_bit(dtype):
    """An add, sub or mul of bf16 (fp16) values that thunder widens to fp32 and rounds back
    runs in bf16 (``add.bf16x2``), and other roundings pack two lanes per conversion: both
    give eager's bits exactly (fp32 has more than twice the precision plus two bits, so its
    intermediate rounding never shows). Inputs span many binades. One output multiplies by a
    per-row value (a scalar in the kernel: computed in fp32, rounded once); the last two widen
    a sum with a constant, which must be rounded before it is widened."""

    def f(a, b):
        return ((a * b + a) * 0.5 - b * 3.0, a * 0.1 + b, -(a - b) * b, a * b.amax(-1, keepdim=True),
                (a + 0.5).float(), (0.25 - b).float())

    low, high = (-20, 12) if dtype == torch.bfloat16 else (-6, 4)  # fp16 overflows at 65504
    scale = torch.exp2(torch.randint(low, high, (64, 4096), device="cuda").float())
    a, b = ((_randn(64, 4096) * scale).to(dtype) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        got = thunder.jit(f, executors=[fuser_ex])(a, b)
    for g, w in zip(got, f(a, b)):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_cat_expanded_and_merged_beside_other_stores(dtype):
    """litgpt's attention inputs as ThunderFX hands them over (q, k and v sliced from one
    projection, RoPE'd, k and v repeated per query head): one kernel over the unmerged
    domain with the cat's select moved to its dims (the CPU test checks the lowered program)."""
    run_without_fallback(rope_from_one_projection, _randn(64, 16, dtype=dtype), _randn(64, 16, dtype=dtype),
                         _randn(2, 32, 128, dtype=dtype))
