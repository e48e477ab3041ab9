"""The callable thunder invokes for one fusion: pick the plan for these inputs, run it.

``THUNDER_FUSER_RANGES=1`` makes each region call a ``torch.profiler`` range named after
its region (``RangedRegionRunner``), so a profile attributes every kernel, ours and the
copies torch makes for a region's outputs, to the region that launched it
(``benchmarks/launchers.py``); off, the call path is untouched.
"""

from __future__ import annotations


import warnings
from collections import OrderedDict

import torch

from thunder_fuser.patches.compile_gc import held
from thunder_fuser.ir.region import Region
from thunder_fuser.backends.reference import run_nodes
from thunder_fuser.runtime import donation
from thunder_fuser.plan.decision import decide
from thunder_fuser.runtime.plan import Plan, plain_tensors, spec_key
from thunder_fuser.runtime.straight_line import straight_line
from thunder_fuser.segment import Segment
from thunder_fuser import config


class RespecializationWarning(UserWarning):
    """A region keeps meeting new input layouts: each builds a plan (and may compile kernels)."""


class RegionRunner:
    def __init__(self, region: Region, segments: list[Segment]):
        self.region = region
        self.segments = segments
        # one plan per layout of the inputs met, least recently used first: at most
        # THUNDER_FUSER_MAX_PLANS (``plan_for``)
        self.plans: OrderedDict[tuple, Plan] = OrderedDict()
        self.respecialized_warned = False
        self.__name__ = region.name
        # the first plan's calls as generated straight-line code (``straight_line``), written
        # after its first call; it returns None for a call it does not fit
        self.fast = None
        self.fast_tried = False
        # the ``LaunchRun`` this region's calls hand their launches to (``thunder_transforms/launch_runs.py``)
        self.run = None

    def plan_for(self, args) -> Plan:
        key = spec_key(args)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = Plan(decide(self.region, self.segments, args))
            self._bound_plans()
        else:
            self.plans.move_to_end(key)
        return plan

    def _bound_plans(self) -> None:
        bound = config.integer("THUNDER_FUSER_MAX_PLANS")
        if bound is None or bound <= 0 or len(self.plans) < bound:
            return
        if not self.respecialized_warned:
            self.respecialized_warned = True
            warnings.warn(
                f"region {self.region.name} has built {len(self.plans)} plans, one for each layout of its inputs "
                f"it met (strides); it keeps the {bound} most recently used (THUNDER_FUSER_MAX_PLANS)",
                RespecializationWarning, stacklevel=4)
        while len(self.plans) > bound:
            self.plans.popitem(last=False)

    def __call__(self, *args):
        # ``call``'s two lines, not a call of it: a frame less (a step makes 30-34 region calls)
        out = None if self.fast is None else self.fast(args)
        return self.general(args) if out is None else out

    def call(self, args):
        """The region on ``args`` (one tuple, passed on as it is: ``runtime/donation.py``
        counts the references the call path makes): the generated code, else ``general``."""
        out = None if self.fast is None else self.fast(args)
        return self.general(args) if out is None else out

    def general(self, args):
        """The plan for these inputs' strides, run by ``Plan.run`` (any call), and the
        generated code written once the first plan has settled."""
        if not self.fast_tried:  # the first calls build the plan: the collector held back as thunder's compile
            with held():
                return self._general(args)
        return self._general(args)

    def _general(self, args):
        if self.run is not None:  # what the run's earlier members deferred launches first
            self.run.flush()
        if not plain_tensors(args) or not self._shapes_as_traced(args):
            return self.as_torch(args)
        plan = self.plan_for(args)
        out = plan.run(args)
        if not self.fast_tried and plan.settled():  # not while kernels compile in workers
            self.fast_tried = True
            self.fast = straight_line(plan, spec_key(args), self.run)
        return out


    def _shapes_as_traced(self, args) -> bool:
        """Are the tensors of the shapes the trace says? A region's plan is made for them; where
        thunder's metadata and torch disagree (thunder 0.2.6 traced the unsummed gradient of a
        broadcast 0-d tensor as 0-d: ``patches/scalar_tensor_grads.py``), torch runs the ops."""
        return all(tuple(a.shape) == v.shape for a, v in zip(args, self.region.inputs) if isinstance(a, torch.Tensor))

    def as_torch(self, args):
        """The region's ops one by one with torch, on tensors no plan runs (a subclass keeps its
        ``__torch_function__``, a sparse tensor its layout, a tensor of another shape than traced
        broadcasts as torch does): what thunder's torch executor does."""
        env: dict[int, object] = dict(zip((id(v) for v in self.region.inputs), args))
        run_nodes(self.region.nodes, env)
        return [env[id(v)] for v in self.region.outputs]


class RangedRegionRunner(RegionRunner):
    """A region call inside a profiler range of the region's name."""

    def __call__(self, *args):
        with torch.profiler.record_function(self.__name__):
            return self.call(args)


donation.RUNNER_CLASS = RegionRunner


def region_runner(region: Region, segments: list[Segment]) -> RegionRunner:
    ranged = config.flag("THUNDER_FUSER_RANGES")
    return (RangedRegionRunner if ranged else RegionRunner)(region, segments)
