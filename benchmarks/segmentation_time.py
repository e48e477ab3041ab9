"""How long segmentation takes as regions grow (NVIDIA/Fuser#3510: nvFuser's segmenter took
300 ms at 20 Linear+ReLU layers and 300 s at 30).

Builds region IR directly (thunder's own tracing of 5,000 ops would dominate the time) for
a stack of MLP activations and RMS norms, then times functionalize + layout + segment.
Run: ``python -m benchmarks.segmentation_time``. Not a test: it prints numbers.
"""

from __future__ import annotations

import time

import torch

from thunder_fuser.functionalize import functionalize
from thunder_fuser.ir.region import Node, Region, Value
from thunder_fuser.layout.allocation_order import dim_provenance, infer_allocation_orders
from thunder_fuser.segment import segment_region

SHAPE = (64, 1024)


class _Builder:
    def __init__(self):
        self.nodes: list[Node] = []
        self.count = 0

    def value(self, shape=SHAPE) -> Value:
        self.count += 1
        return Value(f"t{self.count}", tuple(shape), torch.float32)

    def op(self, op, *args, shape=SHAPE) -> Value:
        out = self.value(shape)
        self.nodes.append(Node(op, args, {}, (out,)))
        return out


def stacked_region(n_ops: int) -> Region:
    """gelu(x + b) activations, each followed by an RMS norm over features (a row norm)
    or, every other layer, over the batch (a column norm, as in batch norm), until
    ``n_ops`` nodes exist: each change of reduced axis forces a new segment."""
    b = _Builder()
    x = Value("x", SHAPE, torch.float32)
    bias = Value("bias", (SHAPE[1],), torch.float32)
    inputs = [x, bias]
    h = x
    layer = 0
    while len(b.nodes) < n_ops:
        axis = layer % 2
        layer += 1
        kept = SHAPE[1 - axis : 2 - axis]
        bb = b.op("broadcast_in_dim", bias, list(SHAPE), (1,))
        h = b.op("add", h, bb)
        t = b.op("tanh", b.op("mul", 0.79788456, b.op("add", h, b.op("mul", 0.044715, b.op("pow", h, 3.0)))))
        h = b.op("mul", b.op("mul", 0.5, h), b.op("add", 1.0, t))
        s = b.op("sum", b.op("mul", h, h), (1 - axis,), shape=kept)
        r = b.op("rsqrt", b.op("add", b.op("div", s, float(SHAPE[1 - axis])), 1e-6), shape=kept)
        rb = b.op("broadcast_in_dim", r, list(SHAPE), (axis,))
        h = b.op("mul", h, rb)
    return Region("bench", inputs, b.nodes[:n_ops], [b.nodes[n_ops - 1].outputs[0]])


def time_segmentation(n_ops: int, repeats: int = 3) -> tuple[float, int]:
    best, n_segments = float("inf"), 0
    for _ in range(repeats):
        region = stacked_region(n_ops)
        start = time.perf_counter()
        functionalize(region)
        orders = {v.name: tuple(range(v.ndim)) for v in region.inputs}
        bcast = {v.name: frozenset() for v in region.inputs}
        infer_allocation_orders(region, orders, bcast, dim_provenance(region, bcast))
        segments = segment_region(region)
        best = min(best, time.perf_counter() - start)
        n_segments = len(segments)
    return best, n_segments


def main(argv=None) -> None:
    from benchmarks import cli

    cli.parser("benchmarks.segmentation_time", __doc__).parse_args(argv)
    print(f"{'ops':>6} {'segments':>9} {'seconds':>9} {'us/op':>7}")
    for n in (100, 1000, 5000):
        secs, n_seg = time_segmentation(n)
        print(f"{n:>6} {n_seg:>9} {secs:>9.4f} {secs / n * 1e6:>7.1f}")


if __name__ == "__main__":
    main()
