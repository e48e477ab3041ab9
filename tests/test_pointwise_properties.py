"""Property: random elementwise programs (broadcast operands of mixed dtypes, transposed and
strided layouts, ragged extents, maybe a reduction at the end) are as near the float64
result as eager is. On the CPU through the torch backend, which runs the lowered programs
with the exact operand views a kernel gets, and compiled to PTX; on a GPU through generated
kernels."""

import pytest
from hypothesis import example, given, settings

from helpers import (
    check_kernels_fall_back_only_where_lowering_does, check_vs_float64, compile_planned_kernels_to_ptx, kernel_examples,
)
from pointwise_programs import Argument, Program, programs

# eager warns of var over a dim of extent 1 (a NaN, which the kernels must match)
pytestmark = pytest.mark.filterwarnings("ignore:var\\(\\). degrees of freedom")

# found by these properties: every dim of extent 1 (its base map rebuilt the operand with
# stride 0 where the kernel reads a vector)
ALL_ONES = Program([Argument((1, 1), "float32", "contiguous")], ["t0 = a + a"], ["t0"])
# found by the PTX property: a bool intermediate of extent 1 (c > 0, broadcast), gathered
# element by element, read as Int8 into a Boolean fragment
BROADCAST_BOOL = Program(
    [Argument((5,), "float32", "contiguous"), Argument((1,), "float32", "contiguous"),
     Argument((1,), "bfloat16", "contiguous")],
    ["t0 = torch.where(c > 0, c, 0.1 * c)", "t1 = torch.sigmoid(t0)", "t2 = t0 + a", "t3 = t1 + a"], ["t2", "t3"],
)

# found by the split-row property on the GPU (session 21): outer modes that do not merge (b
# broadcast along the first, not the second), so a row's coordinate is a tuple, which the
# loop step added the row's (zero) offset to
SPLIT_OUTER_MODES = Program(
    [Argument((3, 3, 129), "float32", "contiguous"), Argument((1, 3, 1), "float32", "contiguous")],
    ["t0 = torch.tanh(a)", "t1 = b + a"], ["t1", "t1.sum(-1)"],
)


@given(programs())  # about 0.1 s an example on the CPU
@example(ALL_ONES)
@example(BROADCAST_BOOL)
def test_random_pointwise_programs_match_float64(program):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_FUSER_KERNELS", "torch")
        check_vs_float64(program.compile(), *program.make_arguments("cpu"))


@pytest.mark.cuda
@settings(max_examples=kernel_examples(60))
@given(programs())
@example(ALL_ONES)
@example(BROADCAST_BOOL)
def test_random_pointwise_programs_match_float64_on_kernels(program):
    """On generated kernels, with the same segments on the reference backend as the torch
    backend's lowering (a reduction over a strided row, for one, is not lowered)."""
    check_kernels_fall_back_only_where_lowering_does(
        program.compile(), program.make_arguments("cuda"), check=check_vs_float64)


@settings(max_examples=kernel_examples(40))
@given(programs())
@example(ALL_ONES)
@example(BROADCAST_BOOL)
def test_random_pointwise_programs_compile_to_ptx(program):
    """Every kernel the torch backend plans for a random program compiles for sm_90a on the
    CPU (CuTe DSL needs no GPU for that): a program that would fall back on the GPU because
    its kernel fails to generate fails here, in CI."""
    compile_planned_kernels_to_ptx(program.compile(), program.make_arguments("cpu"))


def rows_split_early():
    """Every row reduction whose rows hold at least 2 x 64 vectors splits them across blocks
    of 64 threads (``rows_geometry.SPLIT_MIN``), however many rows: the random programs' rows
    (up to 4097 elements) then take the split-row kernels."""
    from thunder_fuser.backends.cute.tiling import rows_geometry

    mp = pytest.MonkeyPatch()
    mp.setattr(rows_geometry, "SPLIT_BLOCKS_PER_SM", 2**20)
    mp.setattr(rows_geometry, "SPLIT_MIN", 2)
    mp.setattr(rows_geometry, "SPLIT_MIN_VECTORS", 1)
    mp.setattr(rows_geometry, "SPLIT_THREADS", 64)
    return mp


@settings(max_examples=kernel_examples(20))
@given(programs(reduction="last"))
@example(SPLIT_OUTER_MODES)
def test_random_reductions_over_split_rows_compile_to_ptx(program):
    mp = rows_split_early()
    try:
        compile_planned_kernels_to_ptx(program.compile(), program.make_arguments("cpu"))
    finally:
        mp.undo()


@pytest.mark.cuda
@settings(max_examples=kernel_examples(40))
@given(programs(reduction="last"))
@example(SPLIT_OUTER_MODES)
def test_random_reductions_over_split_rows_match_float64_on_kernels(program):
    mp = rows_split_early()
    try:
        check_kernels_fall_back_only_where_lowering_does(
            program.compile(), program.make_arguments("cuda"), check=check_vs_float64)
    finally:
        mp.undo()
