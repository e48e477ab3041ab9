"""Fusions common in models that the suite does not time (dev aid; GPU machine): SwiGLU,
log-softmax and logsumexp over LM vocabularies, a residual add fused with RMSNorm,
backwards of softmax and RMSNorm, a masked causal softmax, channel statistics of NCHW
activations, a whole-tensor amax. Prints ms for eager, torch.compile and thunder+fuser,
thunder+fuser's TB/s (bytes read plus written once) as a fraction of a device-to-device
copy measured in the same call, its segments that ran on the reference backend, and the
ops thunder left outside our regions. Each result is checked against eager first.

``--cpu``: the same programs at small sizes on the CPU, checked against eager, with
explain() per case (no timing): a dry run of this script before a device call."""
import sys
import warnings

import thunder_fuser  # noqa: F401
import thunder
import torch
import torch.nn.functional as F

from thunder_fuser import fuser_ex
from thunder_fuser.explain import explain
from thunder_fuser.kernels import backend
from thunder_fuser.kernels.backend import KernelFallbackWarning


def rmsnorm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def add_rmsnorm(x, r, w):
    h = x + r
    return rmsnorm(h, w), h


def swiglu(g, u):
    return F.silu(g) * u


def swiglu_packed(x):
    g, u = x.chunk(2, dim=-1)
    return F.silu(g) * u


def log_softmax(x):
    return torch.log_softmax(x.float(), -1)


def logsumexp(x):
    return torch.logsumexp(x.float(), -1)


def masked_softmax(s, mask):
    return s.masked_fill(mask, float("-inf")).softmax(-1)


def channel_stats(x):
    var, mean = torch.var_mean(x.float(), dim=(0, 2, 3))
    return mean, var


def absmax(x):
    return x.abs().amax()


class backward_of:
    """f's forward and backward as one call, (output, input gradients) for a fixed output
    gradient, the last argument; ``compiled(jit)`` compiles the forward alone (thunder and
    torch.compile differentiate it; neither traces ``autograd.grad``)."""

    def __init__(self, f, fwd=None):
        self.f, self.fwd = f, fwd or f

    def compiled(self, jit):
        return backward_of(self.f, jit(self.f))

    def __call__(self, *args):
        *ins, g = args
        y = self.fwd(*ins)
        grads = torch.autograd.grad(y, [a for a in ins if a.requires_grad], g)
        return (y, *grads)


def _compiled(fn, jit):
    return fn.compiled(jit) if isinstance(fn, backward_of) else jit(fn)


def _bf(*shape, dev, grad=False):
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16, requires_grad=grad)


def cases(dev: str, small: bool):
    s = (lambda big, little: little) if small else (lambda big, little: big)
    rows, n = s(8192, 16), s(4096, 256)
    vocab_rows = s(4096, 8)
    mask_s = s(1024, 64)
    return {
        "swiglu bf16 [8192, 14336]": (swiglu, lambda: (_bf(rows, s(14336, 96), dev=dev), _bf(rows, s(14336, 96), dev=dev))),
        "swiglu from chunk bf16 [8192, 28672]": (swiglu_packed, lambda: (_bf(rows, s(28672, 192), dev=dev),)),
        "log_softmax fp32 of bf16 [4096, 32000]": (log_softmax, lambda: (_bf(vocab_rows, s(32000, 1000), dev=dev),)),
        "logsumexp fp32 of bf16 [2048, 128256]": (logsumexp, lambda: (_bf(s(2048, 4), s(128256, 4001), dev=dev),)),
        "add + rmsnorm bf16 [16384, 4096]": (add_rmsnorm, lambda: (_bf(s(16384, 16), n, dev=dev), _bf(s(16384, 16), n, dev=dev),
                                                                 _bf(n, dev=dev))),
        "rmsnorm fwd+bwd bf16 [16384, 4096]": (backward_of(rmsnorm), lambda: (
            _bf(s(16384, 16), n, dev=dev, grad=True), _bf(n, dev=dev, grad=True), _bf(s(16384, 16), n, dev=dev))),
        "softmax fwd+bwd bf16 [8192, 4096]": (backward_of(lambda x: torch.softmax(x, -1)), lambda: (
            _bf(rows, n, dev=dev, grad=True), _bf(rows, n, dev=dev))),
        "masked softmax bf16 [8, 16, 1024, 1024]": (masked_softmax, lambda: (
            _bf(s(8, 1), 16, mask_s, mask_s, dev=dev),
            torch.ones(mask_s, mask_s, device=dev, dtype=torch.bool).triu(1)[None, None])),
        "var_mean over (0, 2, 3) bf16 [64, 256, 56, 56]": (channel_stats, lambda: (_bf(s(64, 4), s(256, 8), s(56, 7), s(56, 7), dev=dev),)),
        "var_mean over (0, 2, 3) channels-last bf16": (channel_stats, lambda: (
            _bf(s(64, 4), s(256, 8), s(56, 7), s(56, 7), dev=dev).to(memory_format=torch.channels_last),)),
        "batch_norm fwd+bwd NCHW bf16 [32, 128, 56, 56]": (backward_of(
            lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)), lambda: (
            _bf(s(32, 4), s(128, 8), s(56, 7), s(56, 7), dev=dev, grad=True), _bf(s(128, 8), dev=dev, grad=True),
            _bf(s(128, 8), dev=dev, grad=True), _bf(s(32, 4), s(128, 8), s(56, 7), s(56, 7), dev=dev))),
        "abs().amax() bf16 [8192, 8192]": (absmax, lambda: (_bf(s(8192, 64), s(8192, 64), dev=dev),)),
    }


def _flat(x):
    return [t for t in (x if isinstance(x, (tuple, list)) else (x,)) if isinstance(t, torch.Tensor)]


def _check(fn, args, got, want):
    """Each output at most twice as far from a float64 evaluation as eager's, plus the
    dtype's tolerance (a bf16 batch norm's weight gradient, near 1000, sits several ulps
    from the truth both under eager's cuDNN kernel and under thunder's decomposition)."""
    wide = [a.detach().double().requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]
    for g, w, x in zip(_flat(got), _flat(want), _flat(fn(*wide)), strict=True):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (g.shape, g.dtype, w.shape, w.dtype)
        ours, eager = (g.double() - x).abs().max().item(), (w.double() - x).abs().max().item()
        tol = 4e-2 if w.dtype in (torch.bfloat16, torch.float16) else 2e-3
        assert ours <= 2 * eager + tol * (1 + x.abs().max().item()), f"{ours:.3g} from float64, eager {eager:.3g}"


def _outside(jfn) -> list[str]:
    """Ops of the final traces that thunder runs outside our regions (bookkeeping aside)."""
    skip = {"unpack_trivial", "unpack_sequence", "unpack_tuple", "python_return", "python_del", "del",
            "return", "check_tensor_shape_and_metadata", "unpack_key", "unpack_attr", "shallow_copy"}
    traces = [thunder.last_traces(jfn)[-1]]
    bw = thunder.last_backward_traces(jfn)
    if bw:
        traces.append(bw[-1])
    names = []
    for tr in traces:
        for b in tr.bound_symbols:
            name = b.sym.name
            if name in skip or name.startswith(("fuser", "unpack", "clear_mutable")):
                continue
            names.append(name)
    return names


def _moved(args, out) -> int:
    return sum(t.numel() * t.element_size() for t in _flat(args) + _flat(out))


def main():
    cpu = "--cpu" in sys.argv
    dev = "cpu" if cpu else "cuda"
    if not cpu:
        from benchmarks.run import copy_bandwidth
        from benchmarks.timing import device_ms
        copy = copy_bandwidth()
        print(f"device-to-device copy {copy:.2f} TB/s")
    rows = []
    torch.manual_seed(0)
    # every input made before any timing: a graph capture that fails (a backward's, for
    # one) leaves the CUDA generator unusable for torch.randn outside a capture
    made = {name: (fn, make()) for name, (fn, make) in cases(dev, cpu).items()}
    for name, (fn, args) in made.items():
        want = fn(*args)
        jfn = _compiled(fn, lambda f: thunder.jit(f, executors=[fuser_ex]))
        backend.forget_warnings()  # each case's fallbacks warn afresh (one warning per segment name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", KernelFallbackWarning)
            got = jfn(*args)
        fallbacks = [str(w.message)[:160] for w in caught if issubclass(w.category, KernelFallbackWarning)]
        try:
            _check(fn, args, got, want)
            ok = "ok"
        except AssertionError as e:
            ok = "MISMATCH " + str(e)[:100]
        outside = _outside(jfn.fwd if isinstance(jfn, backward_of) else jfn)
        if cpu:
            print(f"== {name}: {ok}; outside: {outside}")
            print(explain(jfn.fwd if isinstance(jfn, backward_of) else jfn))
            continue
        ms = [device_ms(fn, [args])[0], device_ms(_compiled(fn, torch.compile), [args])[0], device_ms(jfn, [args])[0]]
        tbs = _moved(args, want) / (ms[2] * 1e-3) / 1e12
        rows.append((name, ms, tbs / copy, ok, fallbacks, outside))
        print(f"{name}: {ms} {ok} fallbacks={fallbacks} outside={outside}", flush=True)
    if rows:
        print(f"\n{'case':46s} {'eager':>7s} {'compile':>7s} {'fuser':>7s} {'x comp':>6s} {'of copy':>7s}  check, outside ops")
        for name, ms, frac, ok, fb, outside in rows:
            print(f"{name:46s} {ms[0]:7.4f} {ms[1]:7.4f} {ms[2]:7.4f} {ms[1] / ms[2]:6.2f} {frac:7.0%}  {ok}"
                  + (f"; {len(fb)} fallback(s)" if fb else "") + (f"; {sorted(set(outside))}" if outside else ""))


if __name__ == "__main__":
    main()
