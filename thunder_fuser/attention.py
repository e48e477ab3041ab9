"""Attention beside our regions: ``scaled_dot_product_attention`` on the fastest backend torch
has for the device, forward and backward, as an operator executor of its own.

Attention is not ours to generate; our regions only lay out what it reads and read what it
writes. thunder's ``sdpa_ex`` calls FlashAttention-2 or the memory-efficient kernel; on the
H100 torch's cuDNN attention is faster (a GPT block: 0.073 ms forward and 0.232 backward,
against flash's 0.119 and 0.315, ``benchmarks/RESULTS.md``), and it is what torch.compile
uses there. ``attention_ex`` takes SDPA where cuDNN can run it (bf16/fp16, no dropout, the
same heads for q, k and v) and leaves every other call to the executors listed after it
(``sdpa_ex``, thunder's decomposition). A grouped-query call's K and V, expanded to the
query's heads by the model, reach the kernels at their own heads
(``passes/grouped_query_attention.py``); the printed call says so.

A mask (a decode step's: litgpt reads its row of the causal mask for the position) becomes
an additive bias in the query's dtype, ``where(mask, 0, -inf)`` for a boolean one, as torch
hands it to cuDNN: the conversion is a region op of ours, and attention reads the bias
broadcast over batch and heads, never expanded in memory. Without this a masked call went
to ``sdpa_ex``'s memory-efficient kernel (H100 decode step of Llama-3.2-1B: 28 us per layer
against cuDNN's 7, plus a pad, a zeros and a masked fill on the host).

On the CPU it runs torch's flash kernel for the CPU and hands back its output and gradients
laid out as cuDNN's are on the GPU (each like its query, key or value): so the CPU tests meet
the attention layouts that used to cause fallbacks only on the GPU (NVIDIA/Fuser#3386: never
assume an attention output is contiguous; our regions read every input's true strides).
"""

from __future__ import annotations

import math

import torch
import thunder.core.dtypes as dtypes
import thunder.torch as ltorch
from thunder.core.proxies import NumberProxy, TensorProxy
from thunder.core.transforms import get_grad, put_grads
from thunder.extend import OperatorExecutor, register_executor

attention_ex = OperatorExecutor("fuser_attention", version="0.1")
register_executor(attention_ex)

_CUDA_DTYPES = (dtypes.bfloat16, dtypes.float16)
_CPU_DTYPES = (dtypes.float32, dtypes.float64, dtypes.bfloat16, dtypes.float16)


def _scale(q, scale):
    return scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _forward_meta(q, k, v, bias, is_causal: bool, scale: float):
    b, h, sq, _ = q.shape
    out = TensorProxy(like=q, shape=(b, h, sq, v.shape[-1]))
    lse = TensorProxy(like=q, shape=(b, h, sq), dtype=dtypes.float32)
    # cuDNN's dropout seed and offset, which its backward takes back (empty on the CPU)
    seed = TensorProxy(like=q, shape=(0,), dtype=dtypes.int64)
    offset = TensorProxy(like=q, shape=(0,), dtype=dtypes.int64)
    return out, lse, seed, offset


def cudnn_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """``bias`` as cuDNN reads it: its last dim dense and every other stride (but a
    broadcast's 0) a multiple of 16 bytes. torch's own SDPA pads and copies a mask so before
    it calls cuDNN (``preprocess_mask``); we call cuDNN's op directly, and a region may lay a
    mask out otherwise (a prefill's causal mask built from ``cache_position`` came out
    column-major, and cuDNN failed on it). The copy is of the mask's own elements: its
    broadcast dims stay broadcast, and its rows are padded to 16 bytes, as torch's are."""
    if bias is None or _cudnn_reads(bias):
        return bias
    align = max(1, 16 // bias.element_size())
    strides, sizes = bias.stride(), bias.shape
    base = bias[tuple(slice(0, 1) if s == 0 else slice(None) for s in strides)]
    keys = sizes[-1]
    dense = base.new_empty((*base.shape[:-1], -(-keys // align) * align))[..., :keys]
    return dense.copy_(base).expand(sizes)


def _cudnn_reads(t: torch.Tensor) -> bool:
    """Does cuDNN read ``t`` as it is: its last dim dense (or of one element) and every other
    stride of a dim longer than one a multiple of 16 bytes (a broadcast's 0 is)? An operand,
    the bias, and torch's CPU flash kernel (which needs the dense last dim) ask the same."""
    strides, sizes = t.stride(), t.shape
    if strides[-1] != 1 and sizes[-1] != 1:
        return False
    align = 16 // t.element_size() or 1
    for n, s in zip(sizes[:-1], strides[:-1]):
        if n != 1 and s % align:
            return False
    return True


def _dense_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` as attention's kernels read an operand (``_cudnn_reads``), else a contiguous copy.
    torch's CPU flash kernel, handed a q whose last stride was 4, returned wrong values where
    eager's SDPA picks its math kernel. A region may hand over a view where the program asked
    for ``contiguous()`` (``layout.contiguous_for_attention_as_views``); a projection's view
    always qualifies."""
    return t if _cudnn_reads(t) else t.contiguous()


def _forward(q, k, v, bias, is_causal: bool, scale: float):
    q, k, v = (_dense_last(t) for t in (q, k, v))
    if q.device.type == "cuda":
        out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, cudnn_bias(bias), True, 0.0, is_causal, False, scale=scale)
        return out, lse, seed, offset
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=bias, scale=scale)
    return _laid_out_like(q, out), lse, None, None


def _laid_out_like(model: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t`` in ``model``'s dim order: on the CPU as cuDNN's attention allocates its output
    and gradients (like its query, key and value), so that the tests meet the layouts the GPU
    gives; on the GPU the output's gradient as cuDNN's backward must read it (like the output)."""
    if t.stride() == model.stride():
        return t
    # empty_like keeps a dense tensor's strides; torch's strides of an overlapping or
    # sliced one are contiguous anyway
    return torch.empty_like(model, dtype=t.dtype).copy_(t)


def _backward_meta(g, q, k, v, out, lse, seed, offset, bias, is_causal: bool, scale: float):
    return TensorProxy(like=q), TensorProxy(like=k), TensorProxy(like=v)


def _backward(g, q, k, v, out, lse, seed, offset, bias, is_causal: bool, scale: float):
    q, k, v = (_dense_last(t) for t in (q, k, v))  # as the forward read them
    if q.device.type == "cuda":
        # cuDNN's backward reads the output's gradient in the output's strides: torch 2.11
        # builds and caches its plan per shape and q/k/v/out strides, so a gradient laid out
        # otherwise than the call that built the plan comes back silently wrong (1.4 relative
        # error on the H200: tests/test_attention.py, the layouts test). Hand it over like ``out``.
        g = _laid_out_like(out, g)
        # cum_seq_q/k: None (undefined: not a nested batch); max_q/k: the sequence lengths
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            g, q, k, v, out, lse, seed, offset, cudnn_bias(bias), None, None, q.shape[2], k.shape[2], 0.0, is_causal, scale=scale)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _dense_last(g), q, k, v, out, lse, 0.0, is_causal, attn_mask=bias, scale=scale)
    return tuple(_laid_out_like(x, gx) for x, gx in zip((q, k, v), grads))


def _print_grouped(first_qkv: int):
    """The call as thunder prints it, and where K and V have fewer heads than the query
    (``passes/grouped_query_attention.py``), a comment saying so where a user reads the trace."""
    from thunder.core.symbol import default_python_printer

    def printer(bsym, out_printables, arg_printables, kwarg_printables):
        line = default_python_printer(bsym, out_printables, arg_printables, kwarg_printables)
        q, k = bsym.args[first_qkv:first_qkv + 2]
        if isinstance(q, TensorProxy) and isinstance(k, TensorProxy) and k.shape[1] != q.shape[1]:
            line += (f"  # grouped-query: K and V read at their {k.shape[1]} heads, each shared by"
                     f" {q.shape[1] // k.shape[1]} query heads, never expanded (THUNDER_FUSER_GQA)")
        return line

    return printer


attention_forward = attention_ex.register_operator("fuser_attention_forward", meta=_forward_meta, fn=_forward,
                                                   python_printer=_print_grouped(0))
attention_backward = attention_ex.register_operator("fuser_attention_backward", meta=_backward_meta, fn=_backward,
                                                    python_printer=_print_grouped(1))


def _bias_shape(q, k) -> tuple:
    """The scores' shape, ``[batch, heads, queries, keys]``, a mask broadcasts to."""
    return (q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _mask_fits(mask, q, k) -> bool:
    """A boolean mask or an additive bias in the query's dtype, needing no gradient, that
    broadcasts to the scores."""
    if not isinstance(mask, TensorProxy) or mask.ndim > 4 or mask.device != q.device:
        return False
    if not (mask.dtype == dtypes.bool8 or (mask.dtype == q.dtype and not mask.requires_grad)):
        return False
    full = _bias_shape(q, k)
    return all(m in (1, f) for m, f in zip(mask.shape[::-1], full[::-1]))


def _bias(mask, q, k):
    """The mask as cuDNN takes it: an additive bias in q's dtype, ``[b, h, sq, sk]`` as a
    broadcast view (``where(mask, 0, -inf)`` for a boolean mask, torch's own conversion)."""
    if mask is None:
        return None
    if mask.dtype == dtypes.bool8:
        mask = ltorch.where(mask, 0.0, -math.inf).to(q.dtype)
    while mask.ndim < 4:
        mask = ltorch.unsqueeze(mask, 0)
    return ltorch.expand(mask, _bias_shape(q, k))


def _known(x):
    """A number as the checker reads it. ThunderFX's splitter asks with the call's numbers
    as static number proxies (``dropout_p=FloatProxy(0.0)``, ``is_causal=IntegerProxy(False)``
    from litgpt's explicit arguments): read as numbers, or every such attention on a GPU was
    refused here and went to ``sdpa_ex`` (whose gradient refuses a batch-broadcast mask, so
    the splitter sent it to Inductor). A dynamic one stays a proxy and is refused."""
    if isinstance(x, NumberProxy) and not x.is_dynamic():
        return x.value
    return x


def _checker(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None) -> bool:
    dropout_p, is_causal = _known(dropout_p), _known(is_causal)
    qkv = (query, key, value)
    if dropout_p != 0.0 or not all(isinstance(t, TensorProxy) and t.ndim == 4 for t in qkv):
        return False
    if not isinstance(is_causal, bool) or query.shape[1] != key.shape[1] or key.shape[1] != value.shape[1]:
        return False
    if attn_mask is not None and (is_causal or not _mask_fits(attn_mask, query, key)):
        return False
    if is_causal and query.shape[2] != key.shape[2]:
        return False  # which corner a causal mask starts from differs between backends
    if len({t.dtype for t in qkv}) != 1 or len({t.device for t in qkv}) != 1:
        return False
    if query.device.type == "cpu":
        return query.dtype in _CPU_DTYPES
    return (query.device.type == "cuda" and query.dtype in _CUDA_DTYPES
            and _cudnn_runs(query, key, value, None if attn_mask is None else _sizes_4d(attn_mask), is_causal))


def cudnn_admits(q, k, v, bias, is_causal) -> bool:
    """Would torch run cuDNN for this call (``bias`` as ``_bias`` makes it, or None)? Asked of
    a grouped-query call whose K and V keep their own heads (``passes/grouped_query_attention.py``)."""
    return _cudnn_runs(q, k, v, None if bias is None else _sizes_4d(bias), bool(_known(is_causal)))


def _sizes_4d(mask) -> tuple:
    return (1,) * (4 - mask.ndim) + tuple(mask.shape)


def _cudnn_runs(q, k, v, mask_sizes, is_causal: bool) -> bool:
    """Can torch's cuDNN attention take these (its own check, on fake tensors)? Heads up to
    256 wide, as torch's check allows on Hopper: with 128 here, pythia's and Gemma's heads of
    256 went to sdpa_ex's FlashAttention-2 (10.7 ms a pythia-1b step against cuDNN's 6.4 in
    torch.compile's, plus a copy around the flash backward)."""
    if q.shape[-1] % 8 or q.shape[-1] > 256 or v.shape[-1] != q.shape[-1]:
        return False
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.backends.cuda import SDPAParams, can_use_cudnn_attention, cudnn_sdp_enabled
        from thunder.executors.utils import _convert_to_fake_tensor, _convert_to_meta_tensor

        if not cudnn_sdp_enabled():
            return False
        with FakeTensorMode() as mode:
            fq, fk, fv = (_convert_to_fake_tensor(mode, _convert_to_meta_tensor(t)) for t in (q, k, v))
            # the bias as _bias hands it over: the mask's own sizes, broadcast over the rest
            fb = (torch.empty(mask_sizes, dtype=fq.dtype, device=fq.device).expand(_bias_shape(q, k))
                  if mask_sizes is not None else None)
        # grouped-query K/V (fewer heads than q: ``passes/grouped_query_attention.py``) asked as such
        extra = [k.shape[1] != q.shape[1]] if hasattr(SDPAParams, "enable_gqa") else []
        return bool(can_use_cudnn_attention(SDPAParams(fq, fk, fv, fb, 0.0, is_causal, *extra), False))
    except Exception:  # noqa: BLE001 - a torch without the check: leave attention to the next executor
        return False


def _execution(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    bias = _bias(attn_mask, query, key)
    return attention_forward(query, key, value, bias, _known(is_causal), _scale(query, _known(scale)))[0]


def _grad(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None):
    s, is_causal = _scale(query, _known(scale)), _known(is_causal)
    bias = _bias(attn_mask, query, key)
    out, lse, seed, offset = attention_forward(query, key, value, bias, is_causal, s)
    g = get_grad(out)
    dq, dk, dv = attention_backward(g, query, key, value, out, lse, seed, offset, bias, is_causal, s)
    put_grads((query, key, value), (dq, dk, dv))
    return out


attention_ex.register_implementation(
    ltorch.scaled_dot_product_attention, checker=_checker, execution_transform=_execution, grad_transform=_grad,
)
