"""Random elementwise programs over broadcast operands of mixed dtypes and layouts, maybe
ending in a reduction, as Python source (a failing example prints as code to paste and run).

Every op is continuous and finite on any input (no division by a value that can be zero,
no branch that jumps), so a last-ulp difference in one op (tanh, exp) cannot flip a result;
``check_vs_float64`` then compares our error and eager's against a float64 evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from source_program import SourceProgram

LAST_DIMS = [1, 5, 64, 129, 4097]  # ragged and vector-aligned extents along the fastest dim
OTHER_DIMS = [1, 3, 8, 33]
MAX_ELEMENTS = 2**19
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
LAYOUTS = ("contiguous", "transposed", "strided")
UNARY = (
    "torch.tanh({a})", "torch.sigmoid({a})", "-{a}", "{a}.abs()", "torch.exp(-{a}.abs())", "{a}.float()",
    "{a}.to(torch.bfloat16)", "{a} * 0.5 + 1", "torch.where({a} > 0, {a}, 0.1 * {a})", "torch.sqrt({a}.abs() + 1)",
    "torch.where({a} > 1, 1.0, {a})",
)
BINARY = ("{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})", "{a} / ({b}.abs() + 1)")
REDUCTIONS = ("{a}.sum({d})", "{a}.amax({d})", "{a}.mean({d})", "{a}.sum({d}, keepdim=True)", "{a}.var({d})", "{a}.sum()",
              "torch.logsumexp({a}, {d})", "torch.log_softmax({a}, {d})")


@dataclass(frozen=True)
class Argument:
    shape: tuple
    dtype: str
    layout: str  # contiguous | transposed (last two dims swapped in memory) | strided (every other element)

    def source(self, device: str | None = None) -> str:
        s, cast = self.shape, f".to(torch.{self.dtype})"
        dev = f", device={device!r}" if device else ""
        if self.layout == "transposed" and len(s) >= 2:
            return f"torch.randn({', '.join(map(str, (*s[:-2], s[-1], s[-2])))}{dev}){cast}.transpose(-1, -2)"
        if self.layout == "strided" and s:
            return f"torch.randn({', '.join(map(str, (*s[:-1], 2 * s[-1])))}{dev}){cast}[..., ::2]"
        return f"torch.randn({', '.join(map(str, s)) or '()'}{dev}){cast}"

    def make(self, device: str) -> torch.Tensor:
        return eval(self.source(device), {"torch": torch})  # noqa: S307 (test-generated code)


@dataclass(repr=False)
class Program(SourceProgram):
    tag = "pointwise-program"
    arguments: list[Argument]
    lines: list[str] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        args = "\n".join(f"{n} = {a.source()}" for n, a in zip(self.names, self.arguments))
        return f"\n{args}\n{self.source}"

    def make_arguments(self, device: str) -> list[torch.Tensor]:
        return [a.make(device) for a in self.arguments]


@st.composite
def programs(draw, max_ops: int = 5, reduction: bool | str | None = None) -> Program:
    """``reduction``: None, maybe end with a reduction; True, end with one; "last", end
    with one over the last dim (mostly the innermost in memory: a row reduction)."""
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.sampled_from(OTHER_DIMS)) for _ in range(ndim - 1)] + [draw(st.sampled_from(LAST_DIMS))]
    while len(shape) > 1 and torch.Size(shape).numel() > MAX_ELEMENTS:
        shape[0] = 1
    arguments = []
    for k in range(draw(st.integers(1, 3))):
        s = list(shape)
        if k:  # the first argument has the whole shape; the others broadcast against it
            s = [1 if draw(st.integers(0, 3)) == 0 else d for d in s][draw(st.integers(0, ndim - 1)):]
        arguments.append(Argument(tuple(s), draw(st.sampled_from(list(DTYPES))), draw(st.sampled_from(LAYOUTS))))
    prog = Program(arguments)
    ndims = {n: len(a.shape) for n, a in zip(prog.names, arguments)}  # each value's rank
    values = list(prog.names)
    for i in range(draw(st.integers(1, max_ops))):
        a = draw(st.sampled_from(values[-2:] if i else values))  # mostly chains: a deep program, not a wide one
        ndims[f"t{i}"] = ndims[a]
        if draw(st.booleans()):
            expr = draw(st.sampled_from(UNARY)).format(a=a)
        else:
            b = draw(st.sampled_from(values))
            expr = draw(st.sampled_from(BINARY)).format(a=a, b=b)
            ndims[f"t{i}"] = max(ndims[a], ndims[b])
        prog.lines.append(f"t{i} = {expr}")
        values.append(f"t{i}")
    last = values[-1]
    prog.returns.append(last)
    if i and draw(st.booleans()):  # an intermediate is an output too
        prog.returns.append(draw(st.sampled_from(values[len(arguments):-1])))
    if ndims[last] and (reduction or draw(st.booleans())):
        d = -1 if reduction == "last" else draw(st.integers(-ndims[last], ndims[last] - 1))
        prog.returns.append(draw(st.sampled_from(REDUCTIONS)).format(a=last, d=d))
    return prog
