"""Random cat/pad nests through the lowered programs (the torch backend, which runs the exact
operand views a kernel would get): pads of one or two dims, cats along any dim, nested either
way, maybe reshaped, on contiguous or transposed inputs. Each must match eager; a segment
that no template covers must run on the reference backend with the reason explain() names.
On a GPU the same nests run on generated kernels, which must compile wherever the torch
backend's lowering does."""

import pytest
import thunder
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (
    check_kernels_fall_back_only_where_lowering_does, check_vs_eager, compile_planned_kernels_to_ptx, kernel_examples, plans,
)
from thunder_fuser import explain, fuser_ex


@st.composite
def resize_programs(draw):
    """(fn, args, dims): ``fn`` applies a random list of pads and cats to ``args[0]``; ``dims``
    are the dims it cuts along."""
    ndim = draw(st.integers(2, 4))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim - 1)] + [draw(st.sampled_from([4, 5, 8, 12]))]
    transposed = draw(st.booleans())  # the input's fastest dim is its second to last
    steps, extra, dims, cur = [], [], set(), list(shape)
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            padded = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=2, unique=True))
            widths = {d: (draw(st.integers(0, 3)), draw(st.integers(0, 3))) for d in padded}
            steps.append(("pad", widths, draw(st.sampled_from([0.0, -1.5]))))
            for d, (lo, hi) in widths.items():
                cur[d] += lo + hi
                dims.add(d)
        else:
            d = draw(st.integers(0, ndim - 1))
            other = list(cur)
            other[d] = draw(st.integers(1, 6))
            steps.append(("cat", d, len(extra), draw(st.booleans())))
            extra.append(tuple(other))
            cur[d] += other[d]
            dims.add(d)
    reshape = ndim >= 3 and draw(st.booleans())  # merge the two outermost dims

    def fn(x, *ys):
        y = x * 2
        for step in steps:
            if step[0] == "pad":
                _, widths, fill = step
                flat = []
                for d in reversed(range(ndim)):
                    flat += list(widths.get(d, (0, 0)))
                y = torch.nn.functional.pad(y, flat, value=fill)
            else:
                _, d, i, first = step
                y = torch.cat((ys[i] + 1, y) if first else (y, ys[i] + 1), d)
        return y.reshape(-1, *y.shape[2:]) if reshape else y

    x = torch.randn(*shape)
    if transposed:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return fn, [x] + [torch.randn(*s) for s in extra], dims


@given(resize_programs())
def test_random_cat_pad_nests_match_eager_or_say_why_not(program):
    fn, args, dims = program
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THUNDER_FUSER_KERNELS", "torch")
        jfn, _ = check_vs_eager(fn, *args)
    report = explain(jfn)
    for plan in plans(thunder.last_traces(jfn)[-1]):
        for i, kind in plan.decision.kinds.items():
            if kind == "reference":
                assert f"segment {i} runs as reference ({plan.decision.fallbacks[i]})" in report
            elif kind == "resize" and dims == {args[0].ndim - 1} and args[0].stride(-1) == 1:
                assert plan.kernels.get(i) is not None  # cuts along the fastest dim alone always lower


@pytest.mark.cuda
@settings(max_examples=kernel_examples(40))
@given(resize_programs())
def test_random_cat_pad_nests_on_kernels_fall_back_only_where_no_template_covers(program):
    """On the GPU: eager's results, with the same segments on the reference backend as the
    torch backend's lowering (``check_kernels_fall_back_only_where_lowering_does``)."""
    fn, args, _ = program
    # strides kept: a transposed input stays transposed
    check_kernels_fall_back_only_where_lowering_does(fn, [a.cuda() for a in args])


@settings(max_examples=kernel_examples(40))
@given(resize_programs())
def test_random_cat_pad_nests_compile_to_ptx(program):
    """Every kernel the torch backend plans for a nest compiles for sm_90a on the CPU."""
    fn, args, _ = program
    compile_planned_kernels_to_ptx(fn, args)


@pytest.mark.parametrize("dim", [0, 1], ids=["along rows", "along the vector dim"])
def test_a_thread_computes_only_the_cat_piece_it_stores(dim, ptx_compile):
    """Each piece of a cat is computed in a branch of its own, taken by the threads whose
    vector lies in it: the PTX holds each piece's math (a multiply by 3, an exp, a multiply
    by 5) in a basic block apart from the others'. Computed together and then picked, a
    thread did the loads, conversions and math of every piece: grouped-query RoPE's
    backward (25 loads a thread, 8 of them its own) ran at 2.3x Triton's time, bound by
    instructions; in branches it runs at Triton's (H100, Llama-3.2-1B: 37 us a layer
    against 39)."""
    import re

    from helpers import planned_parts, ptx_text
    from thunder_fuser.backends.cute import segment_kernel

    a, b, c = (torch.randn(64, 64) for _ in range(3))
    fn = lambda a, b, c: torch.cat([a * 3.0, torch.exp(b), c * 5.0], dim)  # noqa: E731
    (part,) = planned_parts(fn, (a, b, c))
    ptx = ptx_text(segment_kernel.compile_program(part.prog, part.geo, None))
    blocks = re.split(r"\$L__BB\d+_\d+:", ptx)
    pieces = ("0f40400000", "ex2.approx", "0f40A00000")  # 3.0, exp's, 5.0
    for piece in pieces:
        holding = [blk for blk in blocks if piece in blk]
        assert holding, f"{piece} not in the kernel"
        for blk in holding:
            assert not [p for p in pieces if p != piece and p in blk], f"{piece} shares a block with another piece"
