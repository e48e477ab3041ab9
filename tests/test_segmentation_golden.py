"""Golden segmentation printouts: what a user reads in the trace for the workloads we
benchmark (issue: segment and schedule regions, print the decision in the trace).

Each golden is the fusion call line and its segment comments, exactly as
``thunder.last_traces(jfn)[-1]`` prints them. Scalars that thunder's default cache bakes
into the trace appear as constants.
"""

import thunder
import torch

from benchmarks.workloads import (
    GELU_SCALARS, adam_step, gelu_bias_backward, layernorm, rmsnorm, rope, rotate_half_residual, softmax,
)
from helpers import check_vs_eager, fusion_block
from thunder_fuser import explain, fuser_ex

GELU_BACKWARD = (
    "(t19, t26) = fuser0(T4, T6, T5)\n"
    "# segment 0 [reduction: sum over dims (0, 1)]  (T4) -> (t19)\n"
    "#   t19 = prims.sum(T4, (0, 1))\n"
    "# segment 1 [pointwise]  (T6, T5) -> (t26)\n"
    "#   t8 = prims.mul(0.5, T6)\n"
    "#   t9 = prims.pow(T6, 3.0)\n"
    "#   t10 = prims.mul(0.044715, t9)\n"
    "#   t11 = prims.add(T6, t10)\n"
    "#   inner = prims.mul(0.79788456, t11)\n"
    "#   th = prims.tanh(inner)\n"
    "#   t14 = prims.add(1.0, th)\n"
    "#   left = prims.mul(0.5, t14)\n"
    "#   t16 = prims.mul(th, th)\n"
    "#   t17 = prims.sub(1.0, t16)\n"
    "#   t18 = prims.mul(t8, t17)\n"
    "#   t20 = prims.mul(t18, 0.79788456)\n"
    "#   t21 = prims.mul(0.134145, T6)\n"
    "#   t22 = prims.mul(t21, T6)\n"
    "#   t23 = prims.add(1.0, t22)\n"
    "#   right = prims.mul(t20, t23)\n"
    "#   t25 = prims.add(left, right)\n"
    "#   t26 = prims.mul(T5, t25)\n"
)


def test_gelu_bias_backward_from_fuser_785_is_one_reduction_and_one_pointwise():
    args = [torch.randn(16, 512, 4096) for _ in range(3)]
    jfn, _ = check_vs_eager(gelu_bias_backward, *args, *GELU_SCALARS)
    assert fusion_block(thunder.last_traces(jfn)[-1]) == GELU_BACKWARD


def test_explain_states_why_the_785_region_splits():
    jfn = thunder.jit(gelu_bias_backward, executors=[fuser_ex])
    jfn(*[torch.randn(4, 8, 16) for _ in range(3)], *GELU_SCALARS)
    report = explain(jfn)
    assert report.startswith("region fuser0: 19 ops in 2 segment(s), inputs (T4, T6, T5) -> outputs (t19, t26)\n")
    assert (
        "  segment 1 split from segment 0: sum over (0, 1) and mul over (4, 8, 16) share no input"
    ) in report


def _split_lines_name_their_segments(report: str) -> None:
    """Every "segment M split from segment N: X ..." line describes N as N prints: its
    reduction and dims, or its kind."""
    import re

    regions = re.split(r"^region ", report, flags=re.M)
    assert any(re.search(r"split from segment", r) for r in regions), report
    for region in regions:
        printed = dict(re.findall(r"^  segment (\d+) \[([^\]]+)\]", region, re.M))
        for n, text in re.findall(r"^  segment \d+ split from segment (\d+): (.*)$", region, re.M):
            kind = printed[n]
            reduction = re.match(r"(?:reduction|normalization): (\w+) over dims (\(.*?\))", kind)
            want = f"{reduction[1]} over {reduction[2]}" if reduction else f"the {kind} ops over"
            assert text.startswith(want), f"segment {n} prints as [{kind}], its split line says: {text}"


def test_explain_names_the_segment_a_split_is_about(monkeypatch):
    """issue 62: the reason a segment opened is found against the first segment it was tried
    with, which need not be the one before it, and that segment grows or becomes a view
    segment afterwards: 'segment 2 split from segment 1: sum over (0,)' named segment 0's
    sum, and 'the pointwise ops over (5, 8)' a segment that prints as a view. (The MLP's
    backward region as it was before the GELU's output was made again there for the second
    weight's gradient: ``passes/recompute_in_backward.py``.)"""
    def f(x, y):
        s = x.sum(0)
        return y.sum(1), (s * 2).amax(0)

    jfn = thunder.jit(f, executors=[fuser_ex])
    jfn(torch.randn(4, 6), torch.randn(4, 6))
    report = explain(jfn)
    assert "  segment 2 split from segment 0: sum over (0,) and amax over (0,) have different iteration domains" in report
    _split_lines_name_their_segments(report)

    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    monkeypatch.setenv("THUNDER_FUSER_RECOMPUTE", "0")
    jfn = thunder.jit(mlp, executors=[fuser_ex])
    jfn(torch.randn(5, 8)).sum().backward()
    report = explain(jfn)
    assert ("  segment 1 split from segment 0: the view ops over (5, 8) and sum over (0,) have different "
            "iteration domains") in report
    _split_lines_name_their_segments(report)


SOFTMAX = (
    "(t14,) = fuser0(x)\n"
    "# segment 0 [normalization: amax over dims (1,)]  (x) -> (t14)\n"
    "#   t2 = prims.amax(x, (1,))\n"
    "#   t3 = prims.broadcast_in_dim(t2, [4, 1], [0])\n"
    "#   t5 = prims.broadcast_in_dim(t3, (4, 32), (0, 1))\n"
    "#   t6 = prims.sub(x, t5)\n"
    "#   t7 = prims.exp(t6)\n"
    "#   t9 = prims.sum(t7, (1,))\n"
    "#   t10 = prims.broadcast_in_dim(t9, [4, 1], [0])\n"
    "#   t12 = prims.broadcast_in_dim(t10, (4, 32), (0, 1))\n"
    "#   t14 = prims.div(t7, t12)\n"
)


def test_softmax_is_one_normalization():
    jfn, _ = check_vs_eager(softmax, torch.randn(4, 32))
    assert fusion_block(thunder.last_traces(jfn)[-1]) == SOFTMAX


RMSNORM = (
    "(t16,) = fuser0(x, w)\n"
    "# segment 0 [normalization: sum over dims (1,)]  (x, w) -> (t16)\n"
    "#   xf = prims.convert_element_type(x, dtypes.float32)\n"
    "#   t1 = prims.pow(xf, 2.0)\n"
    "#   t3 = prims.sum(t1, (1,))\n"
    "#   t4 = prims.broadcast_in_dim(t3, [4, 1], [0])\n"
    "#   t5 = prims.div(t4, 32.0)\n"
    "#   t7 = prims.add(t5, 1e-06)\n"
    "#   t8 = prims.rsqrt(t7)\n"
    "#   t9 = prims.broadcast_in_dim(t8, (4, 32), (0, 1))\n"
    "#   t10 = prims.mul(xf, t9)\n"
    "#   t11 = prims.convert_element_type(t10, dtypes.bfloat16)\n"
    "#   t13 = prims.convert_element_type(t11, dtypes.float32)\n"
    "#   t12 = prims.broadcast_in_dim(w, (4, 32), (1,))\n"
    "#   t14 = prims.convert_element_type(t12, dtypes.float32)\n"
    "#   t15 = prims.mul(t13, t14)\n"
    "#   t16 = prims.convert_element_type(t15, dtypes.bfloat16)\n"
)


def test_rmsnorm_forward_is_one_normalization():
    jfn, _ = check_vs_eager(rmsnorm, torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16))
    assert fusion_block(thunder.last_traces(jfn)[-1]) == RMSNORM


LAYERNORM_FORWARD = (
    "(t30, t61, t101) = fuser0(x, w, b)\n"
    "# segment 0 [normalization: var_mean over dims (1,)]  (x, w, b) -> (t30, t61, t101)\n"
    "#   (t29, t30) = prims.var_mean(x, (1,), correction=0)\n"
    "#   t45 = prims.broadcast_in_dim(t29, [4, 1], [0])\n"
    "#   t50 = prims.broadcast_in_dim(t30, [4, 1], [0])\n"
    "#   t59 = prims.add(t45, 1e-05)\n"
    "#   t61 = prims.rsqrt(t59)\n"
    "#   t66 = prims.broadcast_in_dim(t50, (4, 32), (0, 1))\n"
    "#   t72 = prims.sub(x, t66)\n"
    "#   t75 = prims.broadcast_in_dim(t61, (4, 32), (0, 1))\n"
    "#   t81 = prims.mul(t72, t75)\n"
    "#   t85 = prims.broadcast_in_dim(w, (4, 32), (1,))\n"
    "#   t90 = prims.mul(t81, t85)\n"
    "#   t94 = prims.broadcast_in_dim(b, (4, 32), (1,))\n"
    "#   t101 = prims.add(t90, t94)\n"
)

LAYERNORM_BACKWARD = (
    "(t98, t89, t107) = fuser1(t30, w, t102, x, t61)\n"
    "# segment 0 [normalization: sum over dims (1,), sum over dims (0,) per column]  (w, t102, t30, x, t61) -> (t89, t98, t107)\n"
    "#   t85 = prims.broadcast_in_dim(w, (4, 32), (1,))\n"
    "#   t92 = prims.mul(t85, t102)\n"
    "#   t50 = prims.broadcast_in_dim(t30, [4, 1], [0])\n"
    "#   t66 = prims.broadcast_in_dim(t50, (4, 32), (0, 1))\n"
    "#   t72 = prims.sub(x, t66)\n"
    "#   t84 = prims.mul(t72, t92)\n"
    "#   t78 = prims.sum(t84, (1,))\n"
    "#   t75 = prims.broadcast_in_dim(t61, (4, 32), (0, 1))\n"
    "#   t83 = prims.mul(t75, t92)\n"
    "#   t80 = prims.broadcast_in_dim(t78, [4, 1], [0])\n"
    "#   t74 = prims.neg(t83)\n"
    "#   t64 = prims.pow(t61, 3.0)\n"
    "#   t63 = prims.mul(-0.5, t80)\n"
    "#   t65 = prims.mul(t63, t64)\n"
    "#   t69 = prims.sum(t74, (1,))\n"
    "#   t48 = prims.reshape(t65, (4,))\n"
    "#   t71 = prims.broadcast_in_dim(t69, [4, 1], [0])\n"
    "#   t36 = prims.broadcast_in_dim(t48, [4, 1], [0])\n"
    "#   t53 = prims.reshape(t71, (4,))\n"
    "#   t37 = prims.broadcast_in_dim(t36, (4, 32), (0, 1))\n"
    "#   t40 = prims.mul(2.0, t37)\n"
    "#   t33 = prims.broadcast_in_dim(t53, [4, 1], [0])\n"
    "#   t81 = prims.mul(t72, t75)\n"
    "#   t42 = prims.mul(t40, t72)\n"
    "#   t34 = prims.broadcast_in_dim(t33, (4, 32), (0, 1))\n"
    "#   t93 = prims.mul(t81, t102)\n"
    "#   t43 = prims.div(t42, 32.0)\n"
    "#   t35 = prims.mul(0.03125, t34)\n"
    "#   t44 = prims.add(t35, t43)\n"
    "#   t89 = prims.sum(t93, (0,))\n"
    "#   t98 = prims.sum(t102, (0,))\n"
    "#   t107 = prims.add(t83, t44)\n"
)


def test_layernorm_forward_and_backward():
    args = [torch.randn(*s, requires_grad=True) for s in [(4, 32), (32,), (32,)]]
    jfn = thunder.jit(layernorm, executors=[fuser_ex])
    out = jfn(*args)
    assert fusion_block(thunder.last_traces(jfn)[-1]) == LAYERNORM_FORWARD
    grad = torch.randn_like(out)
    out.backward(grad)
    # backward: one segment, the input gradient's row sums and the weight and bias
    # gradients' sums per column (over the rows) side by side, so x and grad are read once;
    # the sums over a dim of one (t48, t53) are views (``ir/small_reductions.py``)
    assert fusion_block(thunder.last_backward_traces(jfn)[-1], "fuser1") == LAYERNORM_BACKWARD
    ref = [a.detach().clone().requires_grad_() for a in args]
    layernorm(*ref).backward(grad)
    for a, r in zip(args, ref):
        torch.testing.assert_close(a.grad, r.grad)


ROPE = (
    "(t4,) = fuser0(x)\n"
    "# segment 0 [resize]  (x) -> (t4)\n"
    "#   t0 = prims.slice_prim(x, [0, 0, 0, 8], [2, 4, 8, 16], [1, 1, 1, 1])\n"
    "#   t1 = prims.neg(t0)\n"
    "#   t2 = prims.slice_prim(x, [0, 0, 0, 0], [2, 4, 8, 8], [1, 1, 1, 1])\n"
    "#   t3 = prims.cat([t1, t2], -1)\n"
    "#   t4 = prims.add(x, t3)\n"
)


def test_rotate_half_rope_plus_residual_is_one_resize():
    jfn, _ = check_vs_eager(rotate_half_residual, torch.randn(2, 4, 8, 16))
    assert fusion_block(thunder.last_traces(jfn)[-1]) == ROPE


ADAM = (
    "(t3, t30, t25) = fuser0(p, m, g, v)\n"
    "# segment 0 [pointwise]  (p, m, g, v) -> (t3, t30, t25)\n"
    "#   t0 = prims.mul(p, 0.99999)\n"
    "#   t2 = prims.lerp(m, g, 0.09999999999999998)\n"
    "#   t3 = copy_to_out_(t2, out=m)\n"
    "#   t4 = prims.mul(v, 0.999)\n"
    "#   t9 = prims.mul(g, g)\n"
    "#   t10 = prims.mul(0.0010000000000000009, t9)\n"
    "#   t11 = prims.add(t4, t10)\n"
    "#   t30 = copy_to_out_(t11, out=v)\n"
    "#   t14 = prims.sqrt(t30)\n"
    "#   t15 = prims.div(t14, 0.05474487190596028)\n"
    "#   t16 = prims.add(t15, 1e-08)\n"
    "#   t21 = prims.div(t3, t16)\n"
    "#   t22 = prims.mul(-0.003690036900369005, t21)\n"
    "#   t23 = prims.add(t0, t22)\n"
    "#   t25 = copy_to_out_(t23, out=p)\n"
)


def test_inplace_adam_step_is_one_pointwise_with_each_tensor_written_once():
    args = [[torch.randn(4, 8)] for _ in range(4)]
    args[3] = [args[3][0].abs()]
    jfn, _ = check_vs_eager(adam_step, *args)
    assert fusion_block(thunder.last_traces(jfn)[-1]) == ADAM


ROPE_Q_AND_K = (
    "(t8, t17) = fuser0(cos, q, sin, k)\n"
    "# segment 0 [resize]  (cos, q, sin) -> (t8)  one launch with segment 1\n"
    "#   t0 = prims.broadcast_in_dim(cos, (1, 4, 8, 16), (2, 3))\n"
    "#   t1 = prims.mul(q, t0)\n"
    "#   t2 = prims.slice_prim(q, [0, 0, 0, 8], [1, 4, 8, 16], [1, 1, 1, 1])\n"
    "#   t3 = prims.neg(t2)\n"
    "#   t4 = prims.slice_prim(q, [0, 0, 0, 0], [1, 4, 8, 8], [1, 1, 1, 1])\n"
    "#   t5 = prims.cat([t3, t4], -1)\n"
    "#   t6 = prims.broadcast_in_dim(sin, (1, 4, 8, 16), (2, 3))\n"
    "#   t7 = prims.mul(t5, t6)\n"
    "#   t8 = prims.add(t1, t7)\n"
    "# segment 1 [resize]  (cos, k, sin) -> (t17)  one launch with segment 0\n"
    "#   t9 = prims.broadcast_in_dim(cos, (1, 2, 8, 16), (2, 3))\n"
    "#   t10 = prims.mul(k, t9)\n"
    "#   t11 = prims.slice_prim(k, [0, 0, 0, 8], [1, 2, 8, 16], [1, 1, 1, 1])\n"
    "#   t12 = prims.neg(t11)\n"
    "#   t13 = prims.slice_prim(k, [0, 0, 0, 0], [1, 2, 8, 8], [1, 1, 1, 1])\n"
    "#   t14 = prims.cat([t12, t13], -1)\n"
    "#   t15 = prims.broadcast_in_dim(sin, (1, 2, 8, 16), (2, 3))\n"
    "#   t16 = prims.mul(t14, t15)\n"
    "#   t17 = prims.add(t10, t16)\n"
)


def test_rope_of_q_and_k_is_two_resize_segments_in_one_launch():
    """q and k have different iteration domains, so two segments; neither reads the other,
    so the schedule runs them as one launch, and the printout says so on both."""
    jfn, _ = check_vs_eager(rope, torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(8, 16), torch.randn(8, 16))
    assert fusion_block(thunder.last_traces(jfn)[-1]) == ROPE_Q_AND_K
