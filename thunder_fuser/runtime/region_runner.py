"""The callable thunder invokes for one fusion: pick the plan for these inputs, run it."""

from __future__ import annotations

from thunder_fuser.ir.region import Region
from thunder_fuser.runtime.plan import Plan, build_plan, spec_key
from thunder_fuser.segment import Segment


class RegionRunner:
    def __init__(self, region: Region, segments: list[Segment]):
        self.region = region
        self.segments = segments
        self.plans: dict[tuple, Plan] = {}
        self.__name__ = region.name

    def plan_for(self, args) -> Plan:
        key = spec_key(args)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = build_plan(self.region, self.segments, args)
        return plan

    def __call__(self, *args):
        plan = self.plans.get(spec_key(args))
        return (plan or self.plan_for(args)).run(args)
