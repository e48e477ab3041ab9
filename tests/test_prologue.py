"""thunder's prologue checks batched into one call (``thunder_fuser/transforms/prologue.py``): the same
inputs pass, any change a check of thunder's would catch still misses the cache (and the
call retraces and matches eager), and a failed check raises thunder's own error."""

import math

import pytest
import thunder
import torch
from torch import nn

import thunder_fuser
from thunder_fuser.thunder_transforms.prologue import _check_inputs, _EXPECTED, batch_checks, check_inputs


class Scaled(nn.Module):
    """Reads numbers from itself (``scale``, ``training``) and an embedding's options."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.lin = nn.Linear(8, 8)
        self.scale = 2.0

    def forward(self, idx, x):
        return (self.lin(self.emb(idx)) + x) * self.scale


def _jit(m):
    return thunder.jit(m, executors=thunder_fuser.executors(), transforms=thunder_fuser.transforms())


def _inputs(dtype=torch.float32, requires_grad=False, n=4):
    return torch.randint(0, 16, (2, n)), torch.randn(2, n, 8, dtype=dtype, requires_grad=requires_grad)


def test_the_prologue_checks_every_input_in_one_call_and_prints_each_check_under_it():
    m = Scaled()
    jm = _jit(m)
    idx, x = _inputs()
    torch.testing.assert_close(jm(idx, x), m(idx, x))
    pro = thunder.last_prologue_traces(jm)[-1]
    names = [b.sym.name for b in pro.bound_symbols]
    assert names.count("fuser_check_inputs") == 1
    assert "check_tensor_metadata" not in names and "check_number_type_and_value" not in names
    call = next(b for b in pro.bound_symbols if b.sym.name == "fuser_check_inputs")
    checked = [s.sym.name for s in call.subsymbols]
    assert checked.count("check_tensor_shape_and_metadata") == 5  # idx, x, the three parameters
    assert "check_number_type_and_value" in checked
    text = str(pro)
    assert "fuser_check_inputs(" in text and "# prims.check_tensor_shape_and_metadata(x, (2, 4, 8)" in text


@pytest.mark.parametrize("change", ["number", "dtype", "shape", "requires_grad", "training"])
def test_a_changed_input_misses_the_cache_and_matches_eager(change):
    torch.manual_seed(0)
    m = Scaled()
    jm = _jit(m)
    idx, x = _inputs()
    jm(idx, x)
    jm(idx, x)
    assert thunder.cache_misses(jm) == 1 and thunder.cache_hits(jm) == 1
    if change == "number":
        m.scale = 3.0
    elif change == "dtype":
        x = x.double()
        m.double()
    elif change == "shape":
        idx, x = _inputs(n=5)
    elif change == "requires_grad":
        x.requires_grad_(True)
    else:
        m.train(not m.training)
    torch.testing.assert_close(jm(idx, x), m(idx, x))
    assert thunder.cache_misses(jm) == 2


def test_a_failed_check_raises_thunders_error_naming_the_value():
    m = Scaled()
    jm = _jit(m)
    jm(*_inputs())
    call = next(b for b in thunder.last_prologue_traces(jm)[-1].bound_symbols if b.sym.name == "fuser_check_inputs")
    key = call.args[0]
    expected = _EXPECTED[key]
    tensors = [torch.empty(s, dtype=dt, device=dev, requires_grad=rg) for s, dev, dt, rg in expected.metas]
    numbers = list(expected.values)
    _check_inputs(key, tensors, numbers)  # what the trace was made for passes
    with pytest.raises(RuntimeError, match="Expected 7 to be equal to and have the type of"):
        _check_inputs(key, tensors, numbers[:-1] + [7])
    with pytest.raises(AssertionError, match=r"expected tensor with \(2, 4\)"):
        _check_inputs(key, [torch.zeros(2, 5, dtype=torch.long)] + tensors[1:], numbers)
    with pytest.raises(AssertionError, match="expected Tensor, got list"):
        _check_inputs(key, [[0]] + tensors[1:], numbers)


def test_a_number_checked_against_nan_keeps_thunders_own_check():
    """NaN equals itself only by thunder's rule, so its check is not batched."""

    class NanScale(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale, self.shift = math.nan, 1.0

        def forward(self, x):
            return x * self.shift + (x * 0).sum() * 0 + torch.nan_to_num(x * self.scale)

    m = NanScale()
    jm = _jit(m)
    x = torch.randn(3)
    torch.testing.assert_close(jm(x), m(x), equal_nan=True)
    jm(x)
    assert thunder.cache_hits(jm) == 1
    pro = thunder.last_prologue_traces(jm)[-1]
    assert "check_number_type_and_value" in [b.sym.name for b in pro.bound_symbols]


def test_a_prologue_with_nothing_to_batch_is_left_as_it_is():
    trace = thunder.trace()(lambda: None)
    assert batch_checks(trace) is trace
    assert check_inputs.name == "fuser_check_inputs"
