"""Edge: build a :class:`Region` from thunder bound symbols (the only IR file that sees thunder).

Proxies become :class:`Value` s keyed by name, thunder dtypes and devices become torch ones,
and each node keeps the line thunder prints for its bound symbol, so printouts of the IR
read exactly like thunder's own traces.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from thunder.core import devices, dtypes
from thunder.core.proxies import NumberProxy, Proxy, TensorProxy
from thunder.core.symbol import BoundSymbol

from thunder_fuser.ir.ops import METADATA, SUPPORTED

CONTIGUOUS = "thunder_fuser: contiguous as torch's kernel returns it"  # a proxy tag: ``eager_decompositions``
MATERIALIZED = "thunder_fuser: a conversion torch makes by .to(), a tensor of its own"  # likewise
MATERIALIZED_FIRST = "thunder_fuser: a conversion torch makes by .to() before thunder's broadcast"  # likewise
from thunder_fuser.ir.region import Node, Region, Value


def op_name(bsym: BoundSymbol) -> str:
    return bsym.sym.name


# torch's conversions (``x.to(dtype)``): thunder records one without a decomposition when it
# changes nothing (``x.half()`` of a half tensor), and torch returns the input itself
CONVERSION_OPS = ("to", "type", "type_as", "half", "float", "double", "bfloat16", "int", "long", "bool")


def as_identity(bsym: BoundSymbol) -> BoundSymbol | None:
    """``prims.shallow_copy`` standing for a conversion to the dtype a tensor already has."""
    out = bsym.output
    if bsym.subsymbols or bsym.sym.name.rsplit(".", 1)[-1] not in CONVERSION_OPS or not isinstance(out, TensorProxy):
        return None
    src = bsym.args[0] if bsym.args else None
    if isinstance(src, TensorProxy) and (src.shape, src.dtype, src.device) == (out.shape, out.dtype, out.device):
        from thunder.core import prims

        return prims.shallow_copy.bind(src, output=out)
    return None


def flatten_to_supported(bsym: BoundSymbol) -> list[BoundSymbol]:
    """Replace a composite bound symbol by the supported prims it decomposes into."""
    if op_name(bsym) in SUPPORTED and (bsym.sym.is_prim or not bsym.subsymbols):
        return [bsym]
    identity = as_identity(bsym)
    if identity is not None:
        return [identity]
    if not bsym.subsymbols:
        raise NotImplementedError(f"thunder_fuser cannot flatten {bsym.sym.name}: it has no decomposition")
    out: list[BoundSymbol] = []
    for sub in bsym.subsymbols:
        out.extend(flatten_to_supported(sub))
    return out


def prim_names(bsym: BoundSymbol) -> set[str] | None:
    """The names of the supported prims ``bsym`` flattens to; None where it cannot be."""
    try:
        return {f.sym.name for f in flatten_to_supported(bsym)}
    except NotImplementedError:
        return None


def _torch_dtype(d):
    if isinstance(d, dtypes.dtype):
        return dtypes.to_torch_dtype(d)
    return d


def bsym_text(bsym: BoundSymbol) -> str:
    return bsym.python(indent=0, print_depth=1)[0].strip()


class _Builder:
    def __init__(self):
        self.values: dict[str, Value] = {}

    def value(self, p: Proxy) -> Value:
        v = self.values.get(p.name)
        if v is None:
            if isinstance(p, TensorProxy):
                v = Value(p.name, tuple(int(s) for s in p.shape), dtypes.to_torch_dtype(p.dtype))
            else:
                v = Value(p.name, (), p.python_type, is_tensor=False)
            self.values[p.name] = v
        return v

    def convert(self, x):
        if isinstance(x, (TensorProxy, NumberProxy)):
            return self.value(x)
        if isinstance(x, dtypes.dtype):
            return _torch_dtype(x)
        if isinstance(x, devices.Device):
            return devices.to_torch_device(x)
        if isinstance(x, tuple):
            return tuple(self.convert(e) for e in x)
        if isinstance(x, list):
            return [self.convert(e) for e in x]
        return x


def build_region(
    name: str, bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy], outputs: Sequence[Proxy]
) -> Region:
    """Region IR for already-flattened ``bsyms`` reading ``inputs`` and returning ``outputs``."""
    b = _Builder()
    in_values = [b.value(p) for p in inputs]
    nodes = []
    for bsym in bsyms:
        args = b.convert(tuple(bsym.args))
        kwargs = {k: b.convert(v) for k, v in bsym.kwargs.items()}
        outs = tuple(b.value(o) for o in bsym.flat_proxy_outs)
        for o, v in zip(bsym.flat_proxy_outs, outs):
            v.contiguous = CONTIGUOUS in o.tags
            v.materialized = MATERIALIZED in o.tags or MATERIALIZED_FIRST in o.tags
            v.converted_first = MATERIALIZED_FIRST in o.tags
        nodes.append(Node(op_name(bsym), args, kwargs, outs, bsym_text(bsym)))
    _count_booleans(nodes)
    out_values = [b.value(p) for p in outputs]
    device = "cpu"
    for p in list(inputs) + list(outputs):
        if isinstance(p, TensorProxy):
            device = p.device.type
            break
    return Region(name, in_values, nodes, out_values, device=device)


def _count_booleans(nodes: list[Node]) -> None:
    """thunder types a sum of booleans as a boolean (``prims.sum`` keeps its input's dtype);
    torch, which thunder's torch executor calls, returns the count (int64), and thunder's
    own rules rely on it: amax's backward divides the cotangent by ``sum(a == max)``, the
    number of tied maxima. Such a sum's result, and the views taken of it, are int64 here as
    at run time there (typed bool, the count was True: each tie got the whole cotangent)."""
    counts: set[int] = set()
    for n in nodes:
        if n.op == "sum" and n.args[0].dtype == torch.bool and n.output.dtype == torch.bool:
            n.output.dtype = torch.int64
            counts.add(id(n.output))
        elif n.op in METADATA and n.args and id(n.args[0]) in counts and n.output.dtype == torch.bool:
            n.output.dtype = torch.int64
            counts.add(id(n.output))
