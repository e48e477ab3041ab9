"""``ir/same_values.py``: a region's second view or conversion of a value is its first."""

import torch

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
