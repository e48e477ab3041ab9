"""Which ``update_aliases`` functionalization drops (``functionalize/functionalize.py``):
the identity on values where its tensors cannot share memory, a barrier otherwise. thunder
lists a written list element twice and groups a tensor with its own upcast as a possible
view; keeping those ended a kernel at each write (an optimizer's update came apart per op).
Two region inputs stay a barrier: values computed outside the region may be views."""

import torch

from thunder_fuser.functionalize.functionalize import functionalize
from thunder_fuser.ir.region import Node, Region, Value


def _t(name, dtype=torch.float32):
    return Value(name, (4,), dtype)


def _alias_nodes(args, make_inputs):
    inputs = make_inputs()
    outs = tuple(_t(f"u{i}") for i in range(len(args(inputs))))
    nodes = list(inputs[1])
    nodes.append(Node("update_aliases", (tuple(args(inputs)),), {}, outs))
    nodes.append(Node("add", (outs[0], outs[-1]), {}, (_t("r"),)))
    region = Region("fuser0", inputs[0], nodes, [nodes[-1].output])
    return [n.op for n in functionalize(region).nodes]


def test_one_tensor_listed_twice_is_the_identity():
    ops = _alias_nodes(lambda io: [io[0][0], io[0][0]], lambda: ([_t("p")], []))
    assert "update_aliases" not in ops


def test_an_input_and_its_own_upcast_are_the_identity():
    def make():
        p = _t("p", torch.bfloat16)
        up = _t("up")
        return [p], [Node("convert_element_type", (p, torch.float32), {}, (up,))]

    ops = _alias_nodes(lambda io: [io[0][0], io[1][0].output], make)
    assert "update_aliases" not in ops


def test_two_region_inputs_stay_a_barrier():
    ops = _alias_nodes(lambda io: [io[0][0], io[0][1]], lambda: ([_t("a"), _t("b")], []))
    assert "update_aliases" in ops


def test_a_fresh_tensor_and_its_view_stay_a_barrier():
    def make():
        a = _t("a")
        fresh, view = _t("fresh"), _t("view")
        return [a], [Node("neg", (a,), {}, (fresh,)), Node("reshape", (fresh, (4,)), {}, (view,))]

    ops = _alias_nodes(lambda io: [io[1][0].output, io[1][1].output], make)
    assert "update_aliases" in ops
