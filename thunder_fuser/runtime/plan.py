"""A decided plan carried out (``plan/decision.py``): its kernels prepared and compiled at
the first call, its steps run, a segment no kernel takes run on the reference backend.

The decision is data; this holds what running it needs beside: each segment's kernel (or
None), each shared launch, the kernels whose outputs a fallback must still lay out, and
whether the first call is over (after it, kernels are waited for, not queued for workers).
What the first call decides (a fallback, a kernel's notes, a launch refused) it records in
the decision, for ``explain``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from thunder_fuser.backends import reference
from thunder_fuser.backends.cute import compile_workers
from thunder_fuser.backends.cute.backend import KERNEL_KINDS, _device_of, kernel_mode, warn_fallback
from thunder_fuser.backends.cute.segment_kernel import SegmentKernel, launch_group
from thunder_fuser.backends.cute.unsupported import Unsupported
from thunder_fuser.ir.ops import METADATA
from thunder_fuser.plan.decision import Decision
from thunder_fuser.segment import Segment

_UNSET = object()

# a segment whose reference run holds more than this beyond its outputs (or, on a GPU, more
# than ``FREE_FRACTION_TO_DEFER`` of its free memory, where that is more) compiles at the
# first call rather than run on the reference backend while a worker compiles it: the first
# step's memory stays near the kernels' (a loss's reference run over a 128k vocabulary and
# 2 x 1024 tokens holds 10.5 GiB). An MLP's SwiGLU at 8192 wide holds 320-576 MiB there:
# with a fixed 256 MiB, transformers' Llama compiled 12 kernels one by one inside its first
# step (6.2-6.9 s on an H100 host) rather than in the workers beside the rest
REFERENCE_BYTES_TO_DEFER = 256 * 2**20
FREE_FRACTION_TO_DEFER = 1 / 16


def reference_budget(device) -> int:
    """The most a deferred segment's reference run may hold on ``device``: a sixteenth of
    its free memory, at least ``REFERENCE_BYTES_TO_DEFER`` (segments run one after another,
    so the first step holds at most that much beyond its kernels' memory)."""
    if getattr(device, "type", None) != "cuda" or torch.cuda.is_current_stream_capturing():
        return REFERENCE_BYTES_TO_DEFER  # (a graph's capture compiles at once anyway: ``compile_workers.paused``)
    free, _ = torch.cuda.mem_get_info(device)
    return max(REFERENCE_BYTES_TO_DEFER, int(free * FREE_FRACTION_TO_DEFER))


def reference_bytes(seg: Segment) -> int:
    """What the reference backend holds at once, beyond the outputs, running ``seg``: every
    op's result but views (a segment's values live until it ends)."""
    outs = {id(v) for v in seg.outputs}
    return sum(v.numel * v.dtype.itemsize for n in seg.nodes if n.op not in METADATA for v in n.outputs
               if v.is_tensor and id(v) not in outs and isinstance(v.dtype, torch.dtype))


@dataclass
class Plan:
    decision: Decision
    kernels: dict = field(default_factory=dict)  # segment index -> SegmentKernel, or None: reference
    groups: dict = field(default_factory=dict)  # first segment index of a step -> LaunchGroup, or None
    # segment index -> its kernel, where the kernel failed to compile after later kernels
    # were laid out against its outputs: the reference backend's outputs are put in its layout
    laid_out: dict = field(default_factory=dict)
    called: bool = False  # after the first call: kernels are no longer queued for workers but waited for

    def _kernel_for(self, seg: Segment, env, compile_now: bool = True):
        """Build the segment's kernel at the plan's first call, when every tensor it reads
        exists; a segment no template can run is recorded as ``reference``."""
        k = None
        mode = kernel_mode(env, self.decision.region)
        if mode is not None and seg.kind in KERNEL_KINDS:
            k = self._or_reference(seg, mode, lambda: self._prepared(seg, mode, env, compile_now))
        self.kernels[seg.index] = k
        return k

    def _prepared(self, seg: Segment, mode: str, env, compile_now: bool) -> SegmentKernel:
        k = SegmentKernel(seg, self.decision.orders, mode)
        device = _device_of(env, self.decision.region)
        k.prepare(env, device, compile_now, defer=self._may_defer([seg], device))
        if notes := k.notes():
            self.decision.kernel_notes[seg.index] = notes
        return k

    def _may_defer(self, segs: list, device) -> bool:
        """May these segments' kernels compile in workers while the reference backend runs
        them (the plan's first call, none holding much memory there: ``reference_budget``)?"""
        if self.called:
            return False
        sizes = [reference_bytes(s) for s in segs]
        if all(b <= REFERENCE_BYTES_TO_DEFER for b in sizes):
            return True
        if compile_workers.count() == 0:  # nothing to defer to: no need to ask the device
            return False
        budget = reference_budget(device)  # the device asked once, not once a segment
        return all(size <= budget for size in sizes)

    def _built(self, seg: Segment, k: SegmentKernel, defer: bool = False):
        """``k`` with its kernels built (waiting for the workers that compile them; ``defer``:
        queued for them), or None where that fails (the reference backend then runs the
        segment, its outputs in ``k``'s layout)."""
        built = self._or_reference(seg, k.mode, lambda: (k.compile(defer), k)[1])
        if built is None:
            self.laid_out[seg.index] = k
        return built

    def settled(self) -> bool:
        """Is every kernel built or given up (none still with a worker)? A member of a
        shared launch needs no kernel of its own."""
        grouped = {id(k) for g in self.groups.values() if g is not None for k in g.kernels}
        return all(g is None or g.ready for g in self.groups.values()) and all(
            k is None or k.ready or id(k) in grouped for k in self.kernels.values())

    def _or_reference(self, seg: Segment, mode: str, build):
        """``build()``; on any failure None, with the segment recorded as ``reference`` and
        one warning (never a failed call)."""
        try:
            return build()
        except Exception as e:  # noqa: BLE001 - any failure must fall back, never fail the call
            self.decision.kinds[seg.index] = "reference"
            self.kernels[seg.index] = None
            self.decision.kernel_notes.pop(seg.index, None)
            reason = str(e) if isinstance(e, Unsupported) else f"{type(e).__name__}: {str(e)[:300]}"
            self.decision.fallbacks[seg.index] = reason
            bug = not isinstance(e, Unsupported)
            if mode == "cute" or bug:
                warn_fallback(self.decision.region.name, seg, reason, bug)
            return None

    def _group_for(self, step: list, env):
        """At the plan's first call: the members' kernels (each reads only what earlier steps
        made, so all can be built now, their own launches not compiled yet) as one launch, or
        None (the reason kept for explain)."""
        ks = [self.kernels[s.index] if s.index in self.kernels else self._kernel_for(s, env, False) for s in step]
        g, why = launch_group(ks, defer=self._may_defer(step, _device_of(env, self.decision.region)))
        self.groups[step[0].index] = g
        if g is None:
            self.decision.apart[step[0].index] = why
            self._compile_alone(step)
        return g

    def _run_group(self, step: list, env) -> bool:
        """Run a step of several segments as one launch; False when they must run one by one."""
        g = self.groups.get(step[0].index, _UNSET)
        if g is _UNSET:
            g = self._group_for(step, env)
        if g is None:
            return False
        if not g.ready:
            if not self.called:
                return False  # compiling in a worker: the members run on the reference backend
            try:
                g.compile()
            except Exception as e:  # noqa: BLE001 - the members still run, one launch each
                self.groups[step[0].index] = None
                self.decision.apart[step[0].index] = f"{type(e).__name__}: {str(e)[:300]}"
                self._compile_alone(step)
                return False
        if g.run(env):
            return True
        self._compile_alone(step)  # a call whose pointers break a member's vector alignment
        return False

    def _compile_alone(self, step: list) -> None:
        """The members' own kernels, for launching one by one (compiled once)."""
        for seg in step:
            k = self.kernels.get(seg.index)
            if k is not None:
                self._built(seg, k, defer=self._may_defer([seg], k.device))

    def run(self, args):
        d = self.decision
        if d.error is not None:
            raise RuntimeError(d.error)
        region = d.region
        if region.grad_enabled and d.written_inputs:
            for i in d.written_inputs:
                a = args[i]
                if a.requires_grad and a.is_leaf:
                    raise RuntimeError(
                        f"a {'' if i in d.directly_written else 'view of a '}leaf Variable that requires grad is being"
                        " used in an in-place operation "
                        f"(in-place write into '{region.inputs[i].name}' in {region.name})"
                    )
        env: dict[int, object] = dict(zip(self.input_ids, args))
        kernels = self.kernels
        for step, frees in self.step_frees:
            if len(step) == 1 or not self._run_group(step, env):
                for seg in step:
                    k = kernels.get(seg.index, _UNSET)
                    if k is _UNSET:
                        k = self._kernel_for(seg, env)
                    if k is not None and not k.ready and self.called:
                        k = self._built(seg, k)
                    if k is None or not k.ready or not k.run(env):
                        # no kernel, one still compiling in a worker, or pointers it does not fit
                        reference.run_nodes(seg.nodes, env)
                        k = k or self.laid_out.get(seg.index)
                        if k is not None:
                            k.conform(env)
                        elif d.viewed:
                            for v in seg.outputs:
                                if id(v) in d.viewed:
                                    env[id(v)] = conform_output(env[id(v)], d.viewed[id(v)])
            for vid in frees:
                env.pop(vid, None)
        self.called = True
        return [env[oid] if strides is None else conform_output(env[oid], strides)
                for oid, strides in self.output_recipe]

    def __post_init__(self):
        self.input_ids = tuple(id(v) for v in self.decision.region.inputs)
        self.output_recipe = tuple((id(o), s) for o, s in zip(self.decision.region.outputs, self.decision.out_strides))
        # per step: its segments, and the ids of the values no later step reads
        free_after = self.decision.schedule.free_after
        self.step_frees = tuple(
            (step, tuple(id(v) for seg in step for v in free_after.get(seg.index, ())))
            for step in self.decision.schedule.steps
        )


def conform_output(t, strides):
    """An output in the layout the plan chose for it: a copy where it came out otherwise."""
    if isinstance(t, torch.Tensor) and t.stride() != strides:
        out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
        out.copy_(t)
        return out
    return t


# the tensors a plan runs: torch's own (a Parameter's ops return plain tensors). Any other
# kind (a subclass with its own ``__torch_function__``, a sparse or nested tensor) is run by
# torch op for op (``RegionRunner.general``), as thunder's torch executor would: thunder's
# trace does not tell them apart
PLAIN_TENSOR_TYPES = frozenset((torch.Tensor, torch.nn.Parameter))


def plain_tensors(args) -> bool:
    return all(type(a) in PLAIN_TENSOR_TYPES and a.layout is torch.strided
               for a in args if isinstance(a, torch.Tensor))


def spec_key(args) -> tuple:
    return tuple([a.stride() if isinstance(a, torch.Tensor) else None for a in args])
