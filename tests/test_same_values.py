"""``ir/same_values.py``: a region's second view, or pointwise value, of the same values is its first."""

import pytest
import thunder
import torch

import thunder_fuser

from thunder_fuser.backends.reference import run_nodes
from thunder_fuser.ir.region import Node, Region, Value
from thunder_fuser.ir.same_values import same_values


def _converts_twice(write: bool = False, both_out: bool = False) -> Region:
    """``x`` (bf16) converted to fp32 twice, the two added (and, with ``write``, ``x``
    written in place between them; with ``both_out``, both conversions returned)."""
    x = Value("x", (4, 8), torch.bfloat16)
    y = Value("y", (4, 8), torch.bfloat16)
    a = Value("a", (4, 8), torch.float32)
    b = Value("b", (4, 8), torch.float32)
    s = Value("s", (4, 8), torch.float32)
    nodes = [Node("convert_element_type", (x, torch.float32), {}, (a,))]
    if write:
        nodes.append(Node("copy_to_out_", (y,), {"out": x}, (Value("w", (4, 8), torch.bfloat16),)))
    nodes += [Node("convert_element_type", (x, torch.float32), {}, (b,)), Node("add", (a, b), {}, (s,))]
    return Region("twice", [x, y], nodes, [s, a, b] if both_out else [s])


def _run(region: Region, x: torch.Tensor, y: torch.Tensor) -> list:
    env = {id(region.inputs[0]): x.clone(), id(region.inputs[1]): y.clone()}
    run_nodes(region.nodes, env)
    return [env[id(o)] for o in region.outputs]


def test_a_second_conversion_of_a_value_is_the_first():
    """transformers' GPT-2 rounds a norm's input gradient to bf16 twice in one region: one
    conversion is left, read by both readers, with the same results."""
    x, y = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    region = _converts_twice()
    want = _run(region, x, y)
    same_values(region)
    assert [n.op for n in region.nodes] == ["convert_element_type", "add"]
    assert region.nodes[1].args[0] is region.nodes[1].args[1]
    torch.testing.assert_close(_run(region, x, y), want)


def test_conversions_stay_where_the_region_writes_in_place():
    """A write between the two makes the second read another value: both stay."""
    region = _converts_twice(write=True)
    same_values(region)
    assert [n.op for n in region.nodes].count("convert_element_type") == 2


def test_two_returned_conversions_stay_two_tensors():
    """Two outputs made one tensor would alias where the caller saw two (one may be written):
    the conversions stay, and the region returns each."""
    region = _converts_twice(both_out=True)
    same_values(region)
    assert [n.op for n in region.nodes].count("convert_element_type") == 2
    assert len({id(o) for o in region.outputs}) == 3


def test_a_returned_duplicate_keeps_its_value():
    """Where the later conversion is the region's output, the output keeps its value (its
    name keys the matmuls that read it) and the first conversion makes it."""
    x = Value("x", (4, 8), torch.bfloat16)
    a, b, s = (Value(n, (4, 8), torch.float32) for n in "abs")
    region = Region("out", [x], [Node("convert_element_type", (x, torch.float32), {}, (a,)),
                                 Node("mul", (a, a), {}, (s,)),
                                 Node("convert_element_type", (x, torch.float32), {}, (b,))], [s, b])
    same_values(region)
    assert [n.op for n in region.nodes] == ["convert_element_type", "mul"]
    assert region.nodes[0].output is b and region.nodes[1].args == (b, b) and region.outputs == [s, b]


def _two_of(op: str, first, second) -> Region:
    """``op(x, first) + op(x, second)`` over fp32 ``x``."""
    x = Value("x", (4, 8), torch.float32)
    a, b, s = (Value(n, (4, 8), torch.float32) for n in "abs")
    nodes = [Node(op, (x, first), {}, (a,)), Node(op, (x, second), {}, (b,)), Node("add", (a, b), {}, (s,))]
    return Region("two", [x], nodes, [s])


def test_a_pointwise_value_made_twice_is_made_once():
    """A value made again in the backward joins the backward of the op that made it (a GELU's
    output beside its gradient): ``erf`` of the same input was computed twice in one
    kernel. The second is the first, with the same results."""
    x = Value("x", (4, 8), torch.float32)
    s1, s2, e1, e2, out = (Value(n, (4, 8), torch.float32) for n in ("s1", "s2", "e1", "e2", "out"))
    region = Region("gelu", [x], [Node("mul", (x, 0.7071067811865476), {}, (s1,)), Node("erf", (s1,), {}, (e1,)),
                                  Node("mul", (x, 0.7071067811865476), {}, (s2,)), Node("erf", (s2,), {}, (e2,)),
                                  Node("mul", (e1, e2), {}, (out,))], [out])
    t = torch.randn(4, 8)
    env = {id(x): t}
    run_nodes(region.nodes, env)
    want = env[id(out)]
    same_values(region)
    assert [n.op for n in region.nodes] == ["mul", "erf", "mul"]
    env = {id(x): t}
    run_nodes(region.nodes, env)
    torch.testing.assert_close(env[id(region.outputs[0])], want, rtol=0, atol=0)


def test_numbers_that_python_calls_equal_keep_two_nodes():
    """``-0.0 == 0.0`` and ``1 == 1.0 == True`` in Python, but ``x * -0.0`` is no ``x * 0.0``
    (the sign of a zero; ``1 / (x * -0.0)`` is ``-inf``): such nodes stay two."""
    for first, second in ((0.0, -0.0), (1, 1.0), (True, 1), (2.0, 2.0000000000000004)):
        region = _two_of("mul", first, second)
        same_values(region)
        assert [n.op for n in region.nodes].count("mul") == 2, (first, second)
    region = _two_of("mul", 0.5, 0.5)
    same_values(region)
    assert [n.op for n in region.nodes].count("mul") == 1


def _twice_over(x, y):
    """The same pointwise values made twice (as a value made again beside its backward is),
    and numbers Python calls equal that a kernel does not: ``1 / (x * 0.0)`` is ``inf`` where
    ``1 / (x * -0.0)`` is ``-inf``."""
    a = torch.exp(x * 0.5) + torch.erf(y)
    b = torch.exp(x * 0.5) * torch.erf(y)
    return a - b, 1 / (x * 0.0) + 1 / (x * -0.0) * 2, (y * 2) + (y * 2.0)


_CASES = {
    "NaN and inf": lambda: (torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0]),) * 2,
    "0-d": lambda: (torch.tensor(0.3), torch.tensor(-2.0)),
    "aliased": lambda: (lambda t: (t, t))(torch.randn(5, 7, generator=torch.Generator().manual_seed(1))),
    "transposed": lambda: (torch.randn(7, 5, generator=torch.Generator().manual_seed(2)).t(),
                           torch.randn(5, 7, generator=torch.Generator().manual_seed(3))),
    "huge": lambda: (torch.randn(1 << 22, generator=torch.Generator().manual_seed(4)),
                     torch.randn(1 << 22, generator=torch.Generator().manual_seed(5))),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_values_made_once_are_eagers_through_thunder(case):
    """Through ``thunder.jit`` with our executors: each output as eager's (NaN where eager's
    is, the sign of an infinity kept), its strides as eager's, and the inputs unchanged."""
    x, y = _CASES[case]()
    before = (x.clone(), y.clone())
    got = thunder.jit(_twice_over, executors=thunder_fuser.executors())(x, y)
    want = _twice_over(x, y)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)
        assert g.stride() == w.stride()
    for t, b in zip((x, y), before):
        torch.testing.assert_close(t, b, rtol=0, atol=0, equal_nan=True)


def test_a_region_that_writes_in_place_computes_its_values_again():
    """A write between two reads of one tensor: the second ``exp`` reads the written value,
    so it is no duplicate (as eager)."""
    def f(x):
        a = torch.exp(x)
        x.mul_(2)
        return a + torch.exp(x)

    x = torch.randn(6, generator=torch.Generator().manual_seed(6))
    xr = x.clone()
    got = thunder.jit(f, executors=thunder_fuser.executors())(x)
    torch.testing.assert_close(got, f(xr))
    torch.testing.assert_close(x, xr)
