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


def _round_trip(through: torch.dtype, dtype=torch.bfloat16, returned: bool = False, copyable: bool = False) -> Region:
    """``x`` (``dtype``) converted to ``through`` and back, then doubled; with ``returned``,
    the round trip's reshape returned as well (``copyable``: one whose aliasing nothing
    observes)."""
    x = Value("x", (4, 8), dtype)
    w, y, r, s = Value("w", (4, 8), through), Value("y", (4, 8), dtype), Value("r", (32,), dtype), Value("s", (4, 8), dtype)
    nodes = [Node("convert_element_type", (x, through), {}, (w,)), Node("convert_element_type", (w, dtype), {}, (y,)),
             Node("reshape", (y, (32,)), {}, (r,)), Node("mul", (y, 2.0), {}, (s,))]
    region = Region("trip", [x], nodes, [s, r] if returned else [s])
    region.copyable_outputs = frozenset({"r"} if copyable else ())
    return region


def _values(region: Region, x: torch.Tensor) -> list:
    env = {id(region.inputs[0]): x}
    run_nodes(region.nodes, env)
    return [env[id(o)] for o in region.outputs]


def test_a_conversion_back_through_a_wider_dtype_is_its_operand():
    """bf16 -> fp32 -> bf16 gives back every value (pythia's attention output gradient went
    through it before the output projection's matmuls, a copy kernel a layer): the readers
    read ``x`` itself and both conversions go, with the same results bit for bit."""
    x = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40, 3.0, -7.5, 65504.0, 1e38] * 4, dtype=torch.bfloat16).reshape(4, 8)
    for through, dtype in ((torch.float32, torch.bfloat16), (torch.float64, torch.float16), (torch.float64, torch.float32)):
        region = _round_trip(through, dtype)
        want = _values(region, x.to(dtype))
        same_values(region)
        assert [n.op for n in region.nodes] == ["mul"] and region.nodes[0].args[0] is region.inputs[0]
        torch.testing.assert_close(_values(region, x.to(dtype)), want, rtol=0, atol=0, equal_nan=True)


def test_a_conversion_through_a_narrower_dtype_rounds_and_stays():
    """fp32 -> bf16 -> fp32 rounds, fp16 -> bf16 -> fp16 too (neither holds the other): both
    conversions stay."""
    for through, dtype in ((torch.bfloat16, torch.float32), (torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)):
        region = _round_trip(through, dtype)
        same_values(region)
        assert [n.op for n in region.nodes].count("convert_element_type") == 2, (through, dtype)


def test_a_round_trip_the_caller_may_see_alias_its_operand_stays():
    """A returned view of the round trip would alias ``x`` where eager's is a tensor of its
    own: taken only where nothing observes that output's aliasing."""
    region = _round_trip(torch.float32, returned=True)
    same_values(region)
    assert [n.op for n in region.nodes].count("convert_element_type") == 2
    region = _round_trip(torch.float32, returned=True, copyable=True)
    same_values(region)
    assert [n.op for n in region.nodes] == ["reshape", "mul"] and region.nodes[0].args[0] is region.inputs[0]


def _trip_between_matmuls(x, w1, w2):
    h = (x @ w1).float().to(torch.bfloat16)  # its gradient: fp32 and back, between matmuls
    return (h @ w2).float().sum(), x.float().to(torch.bfloat16), w1.double().float() * 3


def test_round_trips_through_thunder_keep_eagers_values_and_fresh_outputs():
    """Through ``thunder.jit``: the round trip between two matmuls (and its gradient, in the
    backward) gives eager's loss and gradients; a returned round trip is a tensor of its own
    (writing it leaves the input alone), and no input changes."""
    g = torch.Generator().manual_seed(7)
    x, w1, w2 = (torch.randn(s, generator=g).to(torch.bfloat16) for s in ((16, 32), (32, 24), (24, 8)))
    ours = [t.clone().requires_grad_() for t in (x, w1, w2)]
    theirs = [t.clone().requires_grad_() for t in (x, w1, w2)]
    jf = thunder.jit(_trip_between_matmuls, executors=thunder_fuser.executors())
    (loss, out, out2), (loss_e, out_e, out2_e) = jf(*ours), _trip_between_matmuls(*theirs)
    loss.backward()
    loss_e.backward()
    torch.testing.assert_close(loss, loss_e)
    torch.testing.assert_close(out, out_e, rtol=0, atol=0)
    torch.testing.assert_close(out2, out2_e, rtol=0, atol=0)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)
    for a, t in zip(ours, (x, w1, w2)):
        torch.testing.assert_close(a.detach(), t, rtol=0, atol=0)
    before = [a.detach().clone() for a in ours]
    with torch.no_grad():
        out.add_(1)
    for a, b in zip(ours, before):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0)


def test_a_conversion_of_an_exact_widening_converts_its_operand():
    """fp32 -> fp64 -> bf16 rounds the fp32 values themselves: one conversion of ``x``, with
    the same results bit for bit (the fp64 one goes where nothing else reads it)."""
    x = Value("x", (4, 8), torch.float32)
    w, y = Value("w", (4, 8), torch.float64), Value("y", (4, 8), torch.bfloat16)
    region = Region("wide", [x], [Node("convert_element_type", (x, torch.float64), {}, (w,)),
                                  Node("convert_element_type", (w, torch.bfloat16), {}, (y,))], [y])
    t = torch.randn(4, 8) * 1e3
    want = _values(region, t)
    same_values(region)
    assert [(n.op, n.args) for n in region.nodes] == [("convert_element_type", (x, torch.bfloat16))]
    torch.testing.assert_close(_values(region, t), want, rtol=0, atol=0)


def _trips(x, y):
    """Round trips of fp32 through fp64, read inside and returned."""
    return x.double().float() * y, y.double().float(), (x.double().to(torch.bfloat16) + 1).float()


@pytest.mark.parametrize("case", list(_CASES))
def test_round_trips_are_eagers_on_odd_inputs(case):
    """The round trips through ``thunder.jit`` on NaN/inf/-0, 0-d, aliased, transposed and
    huge inputs: eager's values bit for bit, eager's strides, a returned trip no alias of its
    input, inputs unchanged."""
    x, y = _CASES[case]()
    before = (x.clone(), y.clone())
    got = thunder.jit(_trips, executors=thunder_fuser.executors())(x, y)
    want = _trips(x, y)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        assert g.stride() == w.stride()
    assert got[1].data_ptr() != y.data_ptr()
    for t, b in zip((x, y), before):
        torch.testing.assert_close(t, b, rtol=0, atol=0, equal_nan=True)
