"""A run of a trace's region calls and matmuls whose launches replay as one CUDA graph.

A host-bound training step (pythia-410m at 2 x 1024 tokens on the H100: about 1.3 ms of
GPU work in a 4.4 ms step) waits on Python and driver calls, and a region's own graph
(``region_graphs.py``) saves only its launches' Python: between two regions thunder's trace
calls a matmul or two, each 30-50 us of host time through ATen and cuBLAS (cProfile on the
H100 host), and pythia's step makes 27 of them beside 19 region calls.

The trace pass (``thunder_transforms/launch_runs.py``) finds runs of calls that read no value on the host:
region calls, ``linear`` and 2-D ``matmul``, views, ``del``. Each member of a run does its
host work at once (guards, allocations, views) and hands its launches and the pointers they
touch to the run (``defer``) instead of launching; the run's ``flush``, written before the
first call after the run that is not one of these, replays the launches of all of them as
one graph keyed on all their pointers (``region_graphs.RegionGraphs``: captured at a key's
second sighting; any other key launched in order, each region member through its own
graph, ``Launches``). A matmul here allocates its
output as ATen would (contiguous) and launches ATen's own out-variant (``mm``, ``addmm``
with the bias, as ``linear`` does for a contiguous input), so the values are ATen's.

Nothing launches out of order: a member that cannot hand its launches over (a region whose
code is not graphed or reads what its launches write, through a view that may copy or an
output copied into its layout; a region's first calls; a matmul whose operand would need a
copy; a reshape that copies) flushes the run first and then runs as before. Nothing is
freed early: each deferred launch holds the tensors it touches until the flush. That is
what a run costs in memory: the temporaries of the calls between two flushes live until
the flush (``launch_runs`` ends a run where that would pass ``HELD_BYTES``; ``release``).
``begin`` drops what a failed call left behind.

On by default (``thunder_fuser.transforms``). On the H100, one run with and without them:
pythia-410m 0.89x -> 1.01x torch.compile's step, Qwen2 1.06x -> 1.13x, litgpt
Llama-3.2-1B 1.01x -> 1.05x, transformers Llama 1.03x both. The cost is the capture stream's
cuBLAS workspace (32 MiB, once per process; ``region_graphs.MatmulCapture``): pythia's held
memory 1.067x torch.compile's.
"""

from __future__ import annotations

import torch

from thunder_fuser.cudagraphs.region_graphs import RegionGraphs

# what a run holds past the point where it would have been freed, before it launches what it
# holds there (``launch_runs._held_apart``, ``release``)
HELD_BYTES = 32 << 20

_mm = torch.mm
_addmm = torch.addmm
_empty = torch.empty


class Launches:
    """The deferred launches of one flush, in order (``parts``: what the tests' stand-in
    checks against the key).

    Called when the run's graph is not replayed. Inside its capture (or a whole-step one:
    ``region_graphs.suspended``) every region member's own graph launches plainly, into that
    graph. Otherwise (a key seen for the first time, or a run whose keys never settle, as
    when a loop's allocations drift) a region member replays its own graph (``owns``: its
    ``RegionGraphs``, keyed on its own pointers, ``keys``) as outside a run, so a run is
    never slower than its regions' graphs; a matmul launches plainly."""

    __slots__ = ("parts", "keys", "owns")

    def __init__(self, parts: list, keys: list, owns: list):
        self.parts, self.keys, self.owns = parts, keys, owns

    def __call__(self) -> None:
        for launch, key, own in zip(self.parts, self.keys, self.owns):
            if own is None:
                launch()
            else:
                own(key, launch)


class LaunchRun:
    """One run of one trace: what its members deferred since ``begin``, and its graphs."""

    def __init__(self, name: str):
        self.name = name
        self.graphs = RegionGraphs(name, matmuls=True)
        self.keys: list = []
        self.parts: list = []
        self.owns: list = []  # a region member's own graphs, None for a matmul

    def begin(self) -> None:
        if self.parts:  # a call that raised inside the run: its launches are not wanted
            self.keys, self.parts, self.owns = [], [], []

    def defer(self, key: tuple, launches, own=None) -> None:
        self.keys.append(key)
        self.parts.append(launches)
        self.owns.append(own)

    def flush(self) -> None:
        if not self.parts:
            return
        keys, parts, owns = self.keys, self.parts, self.owns
        self.keys, self.parts, self.owns = [], [], []
        self.graphs(tuple(keys), Launches(parts, keys, owns))

    def release(self, t) -> None:
        """Before a region decides whether to write its output over its dead input ``t``
        (``runtime/donation.py``): where a pending launch holds ``t`` (the trace alone must
        hold it), launch what the run holds if ``t`` is large, so that the region still
        writes over it; a small one is not written over, and the run goes on.

        Without this a run would defeat every donation it spans: pythia's loss forward
        writes the logits' gradient (206 MB) over the logits a linear of the run made, and
        the step's peak rose by 0.17-0.21 GiB on the H100. Flushing for every donation
        splits a run at each region after a matmul (an MLP's activation writes over the
        matmul's output). Counting the pending launches' references as the run's own and
        donating without a flush gave wrong gradients on the H100 (pythia, at the first
        replay of a run) and none on the CPU: not understood, so not done."""
        try:
            held = any(cell.cell_contents is t for launch in self.parts for cell in launch.__closure__ or ())
        except ValueError:  # an empty cell: unknown
            held = True
        if held and t.numel() * t.element_size() >= HELD_BYTES:
            self.flush()

    # ---- the torch ops of a run: ATen's out-variants, launched at the flush. Their launches
    # hold the tensors themselves, no view of them: a view would share the storage, and a
    # tensor whose storage another holds is never written over (``donation.donated``)
    def matmul(self, a, b):
        """``torch.matmul`` of two matrices (``mm``)."""
        sa, sb = a.stride(), b.stride()
        if 1 not in sa or 1 not in sb:  # cuBLAS reads a unit stride: ATen would copy first
            self.flush()
            return torch.matmul(a, b)
        out = _empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        self.defer((a.data_ptr(), sa, b.data_ptr(), sb, out.data_ptr()), lambda: _mm(a, b, out=out))
        return out

    def linear(self, x, w, bias=None):
        """``torch.nn.functional.linear`` of a contiguous input: ATen flattens it to a
        matrix and calls ``addmm`` with the bias, else ``mm`` (``at::linear``)."""
        sw = w.stride()
        if not x.is_contiguous() or 1 not in sw:  # (the trace pass took only a 1-D bias)
            self.flush()
            return torch.nn.functional.linear(x, w, bias)
        n, k = w.shape
        out = _empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
        if bias is None:
            self.defer((x.data_ptr(), w.data_ptr(), sw, out.data_ptr()),
                       lambda: _mm(x.view(-1, k), w.t(), out=out.view(-1, n)))
        else:
            self.defer((x.data_ptr(), w.data_ptr(), sw, bias.data_ptr(), bias.stride(), out.data_ptr()),
                       lambda: _addmm(bias, x.view(-1, k), w.t(), out=out.view(-1, n)))
        return out

    def reshape(self, a, shape):
        """``torch.reshape``: a view where one exists (torch's rule), else the copy, made
        after the launches that write what it reads."""
        try:
            return a.view(shape)
        except RuntimeError:
            self.flush()
            return a.reshape(shape)
