import torch

from thunder_fuser import _compat


def test_thunder_imports_and_stubs_raise_clearly():
    import thunder  # noqa: F401  (would raise AttributeError without the stubs on torch 2.13)

    for name in _compat.NAMED_TENSOR_METHODS:
        assert hasattr(torch.Tensor, name)


def test_changes_nothing_on_a_torch_that_has_the_methods(monkeypatch):
    class FakeTensor:
        pass

    originals = {}
    for name in _compat.NAMED_TENSOR_METHODS:
        fn = lambda self, _n=name: _n  # noqa: E731
        setattr(FakeTensor, name, fn)
        originals[name] = fn
    monkeypatch.setattr(_compat.torch, "Tensor", FakeTensor)
    assert _compat.restore_named_tensor_stubs() == ()
    for name, fn in originals.items():
        assert getattr(FakeTensor, name) is fn


def test_adds_every_missing_method(monkeypatch):
    class FakeTensor:
        pass

    monkeypatch.setattr(_compat.torch, "Tensor", FakeTensor)
    assert _compat.restore_named_tensor_stubs() == _compat.NAMED_TENSOR_METHODS
    try:
        FakeTensor().align_as(None)
    except RuntimeError as e:
        assert "named tensors" in str(e)
    else:
        raise AssertionError("stub should raise")


def test_thunders_autograd_dummies_are_made_without_torchs_python_randn():
    """thunder's autograd glue makes its meta dummies with ``torch.empty`` (``patches/meta_dummy.py``):
    the same meta tensor, without torch's Python reference randn; any other randn is torch's."""
    import thunder.executors.torch_autograd as glue

    import thunder_fuser.patches.meta_dummy as meta_dummy

    assert isinstance(glue.torch, meta_dummy._TorchWithCheapMetaRandn) and glue.torch.autograd is torch.autograd
    d = glue.torch.randn(1, device="meta", requires_grad=True)
    assert d.device.type == "meta" and d.shape == (1,) and d.requires_grad and d.dtype == torch.float32
    torch.manual_seed(0)
    a = glue.torch.randn(3, 4)
    torch.manual_seed(0)
    assert torch.equal(a, torch.randn(3, 4))
    assert meta_dummy.cheapen_thunders_meta_dummies()  # a second call keeps the proxy
