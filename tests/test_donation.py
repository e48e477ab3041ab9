"""An output written over an input nothing reads after it (``passes/dead_inputs.py`` in the trace,
``runtime/donation.py`` at run time): a loss backward's gradient over the logits it was
the last to read, so that the two are never alive together. Never over a tensor the caller
can still reach: one it holds, one it holds a view of, a cotangent, an input of the step.
Results against eager on the reference backend's stand-in for the kernels
(``THUNDER_FUSER_KERNELS=torch``), which runs the same generated code."""

from __future__ import annotations

import pytest
import thunder
import torch
import torch.nn.functional as F

from thunder_fuser import fuser_ex
from thunder_fuser.runtime import straight_line


@pytest.fixture
def donations(monkeypatch, torch_kernels):
    """Each run-time decision of the generated code, True where it wrote over the input."""
    monkeypatch.delenv("THUNDER_FUSER_DONATE", raising=False)  # on by default
    seen = []
    real = straight_line.donated

    def spy(t):
        seen.append(real(t, wrapped=1))  # this frame's reference to t
        return seen[-1]

    monkeypatch.setattr(straight_line, "donated", spy)
    return seen


def _problem():
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(32, 128, requires_grad=True)
    return x, w, torch.randint(0, 128, (64,))


def _grads(fn, x, w, t, steps=3):
    out = []
    for _ in range(steps):
        x.grad = w.grad = None
        r = fn(x, w, t)
        (r[0] if isinstance(r, tuple) else r).backward()
        out.append((x.grad.clone(), w.grad.clone(), r))
    return out


def _check(fn, x, w, t, steps=3):
    got = _grads(thunder.jit(fn, executors=[fuser_ex]), x, w, t, steps)
    want = _grads(fn, x, w, t, 1)[0]
    for gx, gw, _ in got:
        torch.testing.assert_close(gx, want[0])
        torch.testing.assert_close(gw, want[1])
    return got


def test_a_loss_gradient_is_written_over_the_logits_it_read_last(donations):
    """The two-pass loss writes its gradient in the forward's row kernel, the logits' last
    reader (``donor_for``: a row kernel's full-domain store is written in its last pass)."""
    def step(x, w, t):
        return F.cross_entropy((x @ w).float(), t)

    jfn = thunder.jit(step, executors=[fuser_ex])
    _check(step, *_problem())
    assert donations and all(donations), donations  # from the second call on, every call
    _grads(jfn, *_problem(), 2)
    (row_kernel,) = [r for r in _runners(thunder.last_traces(jfn)[-1]) if "donated(" in r.fast.source]


def test_logits_the_caller_holds_are_never_written_over(donations):
    def step(x, w, t):
        logits = x @ w
        return F.cross_entropy(logits.float(), t), logits

    x, w, t = _problem()
    jfn = thunder.jit(step, executors=[fuser_ex])
    for *_, (loss, logits) in _check(step, x, w, t):
        torch.testing.assert_close(logits, (x @ w).detach())
    _grads(jfn, x, w, t, 2)
    # the forward, where the logits are read, writes over nothing (the backward may write
    # over the loss's gradient, which the trace alone holds)
    assert not [r for r in _runners(thunder.last_traces(jfn)[-1]) if "donated(" in r.fast.source]


def _runners(trace) -> list:
    from thunder_fuser.runtime.region_runner import RegionRunner

    return [r for r in trace.python_ctx().values() if isinstance(r, RegionRunner) and r.fast]


def test_logits_the_caller_holds_a_view_of_are_never_written_over(donations):
    """The trace returns a slice, not the logits: the logits are dead by the trace, but the
    slice shares their storage (the run-time check sees a second tensor on it)."""
    def step(x, w, t):
        logits = x @ w
        return F.cross_entropy(logits.float(), t), logits[:, :4]

    x, w, t = _problem()
    for *_, (loss, head) in _check(step, x, w, t):
        torch.testing.assert_close(head, (x @ w).detach()[:, :4])
    assert not any(donations)


def test_inside_a_profiler_range_the_same_call_path(donations, monkeypatch):
    """``THUNDER_FUSER_RANGES=1`` runs each region in a profiler range: the references the
    call path makes are the same, so the dead logits are still written over."""
    monkeypatch.setenv("THUNDER_FUSER_RANGES", "1")

    def step(x, w, t):
        return F.cross_entropy((x @ w).float(), t)

    _check(step, *_problem())
    assert donations and all(donations), donations


def test_an_input_of_the_step_is_never_written_over(donations):
    """Logits passed in (the benchmark's loss over a given tensor): the caller's."""
    def step(x, w, t):
        return F.cross_entropy(x.float(), t)

    x = torch.randn(64, 128, requires_grad=True)
    t = torch.randint(0, 128, (64,))
    jfn = thunder.jit(step, executors=[fuser_ex])
    before = x.detach().clone()
    for _ in range(3):
        x.grad = None
        jfn(x, None, t).backward()
    torch.testing.assert_close(x.detach(), before)
    assert not any(donations)


def test_off_when_asked(monkeypatch, torch_kernels):
    """``THUNDER_FUSER_DONATE=0`` (``runtime/donation.donating``): the generated code allocates."""
    monkeypatch.setenv("THUNDER_FUSER_DONATE", "0")

    def step(x, w, t):
        return F.cross_entropy((x @ w).float(), t)

    jfn = thunder.jit(step, executors=[fuser_ex])
    x, w, t = _problem()
    for _ in range(2):
        jfn(x, w, t).backward()
    runners = _runners(thunder.last_traces(jfn)[-1]) + _runners(thunder.last_backward_traces(jfn)[-1])
    assert runners and not any("donated(" in r.fast.source for r in runners)


def test_an_mlp_step_with_every_dead_intermediate_written_over_matches_eager(donations):
    """A GELU MLP with its loss: forward intermediates dead after a fusion (a matmul's output
    the activation reads last) and backward ones (the loss gradient, the activation's
    gradient) are written over where only the trace holds them; gradients as eager's."""
    torch.manual_seed(1)
    w1, w2 = torch.randn(32, 64, requires_grad=True), torch.randn(64, 128, requires_grad=True)

    def step(x, w, t):
        h = F.gelu(x @ w1 + 1.0)
        return F.cross_entropy((h @ w2).float(), t) * 2.0

    x, _, t = _problem()
    jfn = thunder.jit(step, executors=[fuser_ex])
    for _ in range(3):
        for p in (x, w1, w2):
            p.grad = None
        jfn(x, None, t).backward()
        got = [p.grad.clone() for p in (x, w1, w2)]
        for p in (x, w1, w2):
            p.grad = None
        step(x, None, t).backward()
        for g, p in zip(got, (x, w1, w2)):
            torch.testing.assert_close(g, p.grad)
    assert any(donations), donations
