"""Random programs as an attacker writes them: elementwise ops, casts, views, slices,
concatenation, reductions and softmaxes, in-place writes into inputs and views of them,
over 1-3 inputs of four dtypes (0-d tensors included) in six layouts, some holding NaN or
infinity. Each program is Python source (a failing example prints as code to paste and
run); every line is run by eager while it is drawn, so only programs eager runs are made."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from source_program import SourceProgram

DTYPES = ("float32", "bfloat16", "float16", "float64")
LAYOUTS = ("contiguous", "transposed", "strided", "channels_last", "permuted", "expanded")
SPECIALS = ("none", "none", "nan", "inf", "-inf")
UNARY = (
    "torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})", "{a}.abs()", "-{a}", "torch.exp(-{a}.abs())",
    "torch.sqrt({a}.abs() + 1)", "torch.log1p({a}.abs())", "{a} * 0.5 + 1", "{a}.float()", "{a}.to(torch.bfloat16)",
    "F.gelu({a})", "F.silu({a})", "{a}.clamp(-1, 1)", "F.gelu({a}, approximate='tanh')", "0.9 ** {a}",
    "({a}.abs() + 1) ** 0.5",
)
BINARY = (
    "{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})", "torch.minimum({a}, {b})",
    "{a} / ({b}.abs() + 1)", "torch.where({a} > {b}, {a}, {b})", "torch.add({a}, {b}, alpha=-1.5)",
)
SHAPING = (
    "{a}.transpose(0, -1)", "{a}[..., 1:]", "{a}[1:]", "{a}.unsqueeze(0)", "{a}.reshape(-1)", "torch.cat([{a}, {a} * 2], {d})",
    "{a}.sum({d}, keepdim=True)", "{a}.amax({d})", "{a}.mean({d})", "torch.softmax({a}, {d})",
    "torch.log_softmax({a}, {d})", "{a}.sum()", "{a}.contiguous()",
)
IN_PLACE = (
    "{x}.add_({b})", "{x}.mul_({b})", "{x}.copy_({b})", "{x}[0].mul_(2)", "{x}[..., :1].zero_()",
    "{x}.clamp_(-1, 1)", "{x}.sub_({b}, alpha=0.5)",
)


# what thunder 0.2.6 itself gets wrong, with any executor: not drawn here; each is a strict
# xfail of its own (``test_random_programs.py``)
THUNDERS_OWN = {
    "transpose of a 0-d tensor": lambda template, a: ".transpose(" in template and a.ndim == 0,
    # and ``x.copy_(y)`` with ``y`` broadcast to ``x`` ("Shapes were expected to be the same"),
    # which the in-place writes below skip
}


# what thunder 0.2.6 cannot differentiate, with any executor: a program holding it has its
# values compared, not its gradients (a strict xfail each)
THUNDERS_OWN_GRADIENTS = {
    # minimum has no gradient rule (a strict xfail); maximum's splits a tie (maximum(x, x), a
    # common draw) its own way
    "minimum and maximum": lambda line: "torch.maximum(" in line or "torch.minimum(" in line,
}


@dataclass(frozen=True)
class Input:
    shape: tuple
    dtype: str
    layout: str
    special: str  # none | nan | inf | -inf: the first element holds it

    def source(self, name: str, device: str = "cpu") -> str:
        """Lines that make the input ``name``: a base, its special value, then its view."""
        s, dev = self.shape, f", device={device!r}"
        n = len(s)
        order = list(range(n))
        if self.layout == "transposed" and n >= 2:
            order[-1], order[-2] = order[-2], order[-1]
        elif self.layout == "channels_last" and n == 4:
            order = [0, 2, 3, 1]
        elif self.layout == "permuted":
            order = order[::-1]
        stored = [s[d] for d in order]
        if self.layout == "strided" and n:
            stored[-1] *= 2
        if self.layout == "expanded" and n:
            stored[0] = 1
        base = f"torch.randn({', '.join(map(str, stored)) or '()'}{dev}).to(torch.{self.dtype})"
        lines = [f"{name} = {base}"]
        if self.special != "none":
            lines.append(f"{name}.view(-1)[0] = float({self.special!r})")
        if order != list(range(n)):
            back = sorted(range(n), key=lambda i: order[i])
            lines.append(f"{name} = {name}.permute({', '.join(map(str, back))})")
        if self.layout == "strided" and n:
            lines.append(f"{name} = {name}[..., ::2]")
        if self.layout == "expanded" and n:
            lines.append(f"{name} = {name}.expand({', '.join(map(str, s))})")
        return "\n".join(lines)

    def make(self, device: str) -> torch.Tensor:
        ns = {"torch": torch}
        exec(self.source("x", device), ns)  # noqa: S102 (test-generated code)
        return ns["x"]


@dataclass(repr=False)
class AttackProgram(SourceProgram):
    tag = "attack-program"
    arguments: list[Input]
    lines: list[str] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)
    writes: bool = False  # writes into an input in place

    @property
    def differentiable(self) -> bool:
        """No in-place write, nothing thunder 0.2.6 cannot differentiate, finite inputs of 32
        or 64 bits (why: ``attack_programs``), and no amax or amin of an expanded input: its
        equal elements tie, and eager splits a tie only where its values are equal to the bit,
        which its CPU loops break by rounding a row's vectorized body and its tail apart
        (``add(t * a, t, alpha=-1.5).amax(0)``: eager gave one of three tied rows the whole
        gradient, a fusion each a third). Ties themselves: ``test_never_wrong``."""
        ties = any(i.layout == "expanded" for i in self.arguments) and any(
            ".amax(" in line or ".amin(" in line for line in self.lines)
        return (not self.writes and not ties and not any(f(l) for l in self.lines for f in THUNDERS_OWN_GRADIENTS.values())
                and all(i.special == "none" and i.dtype in ("float32", "float64") for i in self.arguments))

    def __repr__(self) -> str:
        args = "\n".join(i.source(n) for n, i in zip(self.names, self.arguments))
        return f"\nimport torch\nimport torch.nn.functional as F\n{args}\n{self.source}"

    def make_arguments(self, device: str) -> list[torch.Tensor]:
        return [i.make(device) for i in self.arguments]


def _small(inp: Input) -> torch.Tensor:
    return inp.make("cpu")  # meta tensors let through what the CPU refuses (softmax of a 0-d tensor over dim 1)


def _try(expr: str, env: dict):
    """``expr`` evaluated on the drawn inputs, or None where eager refuses it."""
    try:
        out = eval(expr, {"torch": torch, "F": F}, dict(env))  # noqa: S307 (test-generated code)
    except Exception:  # noqa: BLE001 - eager's refusal: the op is not drawn
        return None
    return out if isinstance(out, torch.Tensor) else None


@st.composite
def attack_programs(draw, max_ops: int = 12, grads: bool = False) -> AttackProgram:
    """``grads``: no in-place writes (the program's gradients are compared)."""
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.sampled_from((1, 2, 3, 5, 8))) for _ in range(ndim))
    inputs = []
    for k in range(draw(st.integers(1, 3))):
        s = shape
        if k and s and draw(st.booleans()):  # broadcasts against the first: fewer dims or ones
            s = tuple(1 if draw(st.integers(0, 2)) == 0 else d for d in s)[draw(st.integers(0, len(s))):]
        layout = draw(st.sampled_from(LAYOUTS))
        # gradients are compared on finite inputs: thunder 0.2.6's decompositions differentiate
        # an infinity to NaN where torch's formulas give a number (sigmoid at -inf: a strict xfail)
        special = "none" if grads else draw(st.sampled_from(SPECIALS))
        # and in 32 or 64 bits: a 16-bit program's rounding moves where a kink (abs, where) falls
        dtype = draw(st.sampled_from(DTYPES[::3] if grads else DTYPES))
        inputs.append(Input(s, dtype, layout, special))
    prog = AttackProgram(inputs)
    env = {n: _small(i) for n, i in zip(prog.names, inputs)}
    writable = [n for n, i in zip(prog.names, inputs) if i.layout != "expanded"]
    values = list(prog.names)
    count = 0
    for _ in range(draw(st.integers(3, max_ops))):
        a = draw(st.sampled_from(values[-3:]))
        b = draw(st.sampled_from(values))
        d = draw(st.integers(-4, 3))
        family = draw(st.sampled_from(("unary", "binary", "binary", "shaping") + (() if grads else ("in_place",))))
        if family == "in_place":
            if not writable:
                continue
            x = draw(st.sampled_from(writable))
            line = draw(st.sampled_from(IN_PLACE)).format(x=x, b=b)
            if ".copy_(" in line and env[b].shape != env[x].shape:  # THUNDERS_OWN: a broadcasting copy_
                continue
            if _try(f"({line})", env) is None:
                continue
            prog.lines.append(line)
            prog.writes = True
            continue
        template = draw(st.sampled_from({"unary": UNARY, "binary": BINARY, "shaping": SHAPING}[family]))
        if any(thunder_fails(template, env[a]) for thunder_fails in THUNDERS_OWN.values()):
            continue
        expr = template.format(a=a, b=b, d=d)
        out = _try(expr, env)
        if out is None or out.numel() > 4096:
            continue
        name = f"t{count}"
        count += 1
        env[name] = out
        prog.lines.append(f"{name} = {expr}")
        values.append(name)
    computed = values[len(inputs):]
    if not computed:
        prog.lines.append("t_last = a * 2")
        computed = ["t_last"]
    prog.returns.append(computed[-1])
    if len(computed) > 1 and draw(st.booleans()):
        prog.returns.append(draw(st.sampled_from(computed[:-1])))
    return prog
