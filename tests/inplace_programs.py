"""Random programs that mix in-place and out-of-place ops, as Python source.

A program is generated as text, so a failing example prints as code a person can paste
and run. Values are tracked by shape, so most programs are valid; some deliberately are
not (an in-place op whose result would need a larger shape), and then eager's error is the
expected outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from source_program import SourceProgram

BASE = (4, 6)
SCALARS = ("0.5", "2.0", "-1.5")


@dataclass(repr=False)
class Program(SourceProgram):
    tag = "inplace-program"
    alias: str  # how x and y relate: distinct | same
    lines: list[str] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        body = "\n".join(f"    {l}" for l in self.lines) or "    pass"
        ret = ", ".join(self.returns)
        return f"def program(x, y, z, i):\n{body}\n    return ({ret}{',' if len(self.returns) == 1 else ''})\n"

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        return f"\n# arguments: {describe_arguments(self.alias)}\n{self.source}"


def describe_arguments(alias: str) -> str:
    return {
        "distinct": "x, y = randn(4, 6), randn(4, 6); z = randn(6); i = tensor([2, 0])",
        "same": "x = y = randn(4, 6); z = randn(6); i = tensor([2, 0])",
    }[alias]


def make_arguments(alias: str, device: str = "cpu"):
    """Fresh arguments, plus every tensor whose final contents must match eager."""
    i = torch.tensor([2, 0], device=device)
    if alias == "distinct":
        x, y, z = (torch.randn(s, device=device) for s in (BASE, BASE, BASE[1]))
        return [x, y, z, i], [x, y, z]
    x, z = torch.randn(BASE, device=device), torch.randn(BASE[1], device=device)
    return [x, x, z, i], [x, z]


# views of a (4, 6) tensor: (expression template, resulting shape)
VIEWS = [
    ("{v}", BASE),
    ("{v}[1:3]", (2, 6)),
    ("{v}.t()", (6, 4)),
    ("{v}[:, 2:5]", (4, 3)),
    ("{v}.chunk(2, 1)[1]", (4, 3)),
    ("{v}.select(0, 1)", (6,)),
    ("{v}[2]", (6,)),
    ("{v}.view(2, 2, 6)", (2, 2, 6)),
    ("{v}.reshape(4, 2, 3)", (4, 2, 3)),
]


@st.composite
def programs(draw, max_statements: int = 7) -> Program:
    # Two different views of one base as two arguments are not generated: thunder 0.2.6
    # treats any arguments sharing a storage as one tensor (test_inplace.py shows it).
    # Views of one argument taken inside the program cover that aliasing instead.
    alias = draw(st.sampled_from(["distinct", "same"]))
    prog = Program(alias)
    full = ["x", "y"]  # names of values shaped like BASE
    vec = ["z"]  # names shaped (6,)
    n_tmp = 0

    def operand(shape):
        """Something that broadcasts to ``shape``: a scalar, z, or a value of that shape."""
        choices = list(SCALARS)
        if shape[-1] == 6:
            choices += vec
        if shape == BASE:
            choices += full
        elif shape == (6, 4):
            choices += [f"{v}.t()" for v in full]
        elif shape == (2, 6):
            choices += [f"{v}[2:]" for v in full]
        elif shape == (4, 3):
            choices += [f"{v}[:, :3]" for v in full]
        return draw(st.sampled_from(choices))

    for _ in range(draw(st.integers(1, max_statements))):
        kind = draw(st.sampled_from(["inplace", "inplace", "inplace", "compute", "setitem"]))
        if kind == "compute":
            a, b = draw(st.sampled_from(full)), draw(st.sampled_from(full + vec))
            expr = draw(st.sampled_from(["{a} * {b}", "{a} + {b} * 0.5", "torch.tanh({a}) - {b}", "{a}.clone()"]))
            name = f"t{n_tmp}"
            n_tmp += 1
            prog.lines.append(f"{name} = " + expr.format(a=a, b=b))
            full.append(name)
            prog.returns.append(name)
            continue
        target_base = draw(st.sampled_from(full))
        template, shape = draw(st.sampled_from(VIEWS))
        target = template.format(v=target_base)
        if kind == "setitem":
            idx = draw(st.sampled_from(["[1:3]", "[:, 0]", "[{m} > 0]", "[0]"]))
            if "{m}" in idx:
                idx = idx.format(m=draw(st.sampled_from(full)))
                prog.lines.append(f"{target_base}{idx} = {draw(st.sampled_from(SCALARS))}")
            else:
                prog.lines.append(f"{target_base}{idx} = {draw(st.sampled_from(SCALARS))}")
            continue
        op = draw(st.sampled_from(
            ["add_", "sub_", "mul_", "div_", "clamp_", "copy_", "zero_", "fill_", "masked_fill_", "index_copy_"]
        ))
        if op in ("add_", "sub_", "mul_"):
            prog.lines.append(f"{target}.{op}({operand(shape)})")
        elif op == "div_":
            prog.lines.append(f"{target}.div_({draw(st.sampled_from(SCALARS))})")
        elif op == "clamp_":
            prog.lines.append(f"{target}.clamp_(-0.5, 0.75)")
        elif op == "copy_":
            src = operand(shape)
            prog.lines.append(f"{target}.copy_({src})" if src not in SCALARS else f"{target}.fill_({src})")
        elif op == "zero_":
            prog.lines.append(f"{target}.zero_()")
        elif op == "fill_":
            prog.lines.append(f"{target}.fill_({draw(st.sampled_from(SCALARS))})")
        elif op == "masked_fill_":
            prog.lines.append(f"{target}.masked_fill_({target} > 0, {draw(st.sampled_from(SCALARS))})")
        else:  # index_copy_ of two rows into a (4, 6) tensor
            src = draw(st.sampled_from([f"{v}[2:]" for v in full]))
            prog.lines.append(f"{target_base}.index_copy_(0, i, {src})")
    if draw(st.integers(0, 9)) == 0:
        # an in-place op whose broadcast result is larger than its target: eager raises
        at = draw(st.integers(0, len(prog.lines)))
        prog.lines.insert(at, f"{draw(st.sampled_from(full[:2]))}[0].add_({draw(st.sampled_from(full[:2]))})")
    if not prog.returns:
        prog.returns.append(draw(st.sampled_from(["x * 1.0", "x + y", "y.sum(0)"])))
    return prog
