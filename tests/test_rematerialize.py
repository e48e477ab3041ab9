"""Rematerialization: a forward fusion stores only what its backward cannot cheaply
recompute, and a trace that writes in place keeps every value it computed (``passes/rematerialize.py``)."""

from __future__ import annotations

import thunder
import torch
import torch.nn.functional as F

from helpers import check_gradients, plans
from thunder_fuser import fuser_ex


def _forward_outputs(jfn) -> list:
    (plan,) = plans(thunder.last_traces(jfn)[-1])
    return [(tuple(v.shape), v.dtype) for v in plan.decision.region.outputs]


def _tanh_gelu(x, w):
    return F.gelu(x * w, approximate="tanh")


def test_a_tanh_gelu_forward_stores_its_output_alone():
    """Without rematerialization the forward wrote seven fp32 intermediates of the input's
    shape for the backward; now it writes its bf16 result, and the backward recomputes the
    rest from the forward's inputs."""
    check_gradients(_tanh_gelu, torch.randn(8, 64), [torch.randn(64)])  # fp32: bf16 eager rounds its sums
    x, w = (torch.randn(*s, dtype=torch.bfloat16, requires_grad=True) for s in ((8, 64), (64,)))
    jfn = thunder.jit(_tanh_gelu, executors=[fuser_ex])
    jfn(x, w).float().sum().backward()
    assert _forward_outputs(jfn) == [((8, 64), torch.bfloat16)]


def _scaled_by_buffer(x, buf):
    y = x * torch.exp(buf * 2)
    buf.add_(1)
    return y


def test_a_trace_that_writes_in_place_keeps_the_values_it_computed():
    """Recomputing ``exp(buf * 2)`` in the backward would read ``buf`` after ``add_``: the
    forward must store the exp, as it did before rematerialization."""
    x, buf = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    before = buf.clone()
    jfn = thunder.jit(_scaled_by_buffer, executors=[fuser_ex])
    y = jfn(x, buf)
    grad = torch.randn_like(y)
    y.backward(grad)
    torch.testing.assert_close(y, x.detach() * torch.exp(before * 2))
    torch.testing.assert_close(x.grad, torch.exp(before * 2) * grad)
    torch.testing.assert_close(buf, before + 1)
    assert ((4, 8), torch.float32) in _forward_outputs(jfn)
