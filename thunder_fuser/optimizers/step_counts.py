"""The host's view of a param group's step counts, and the ``+= 1`` of every one of them.

A jitted Adam step needs each parameter's count on the host before anything runs (the bias
corrections are computed from it in double, as torch does; parameters at different counts
take one update call per count). Reading the counts is costly: a count on a GPU (``fused``
or ``capturable`` state) makes the host wait for the device, and reading hundreds of CPU
counts one by one took half of a GPT-2 step's host part. So the host mirrors them:

* ``GroupCounts`` holds one group's step tensors, their values and their version counters
  as the last step left them. While the same tensors come back with the same versions (no
  one else wrote them), their values are known and nothing is read; otherwise a new
  ``GroupCounts`` is made, and it reads again only the tensors whose version moved
  (``TensorMirror``, which remembers each tensor as the last ``GroupCounts`` left it).
* ``GroupCounts.count()`` adds one to every count. Counts on the host (torch's default,
  neither fused nor capturable) are written by one ``_foreach_copy_`` per count and dtype
  from a 0-d tensor holding that count plus one, added in the count's own dtype as ``+= 1``
  adds it (the same number, past 2**24 too): on 148 CPU counts that copy took 0.07 ms where
  torch's ``_foreach_add_`` took 0.30 (its CPU foreach add walks each 0-d tensor on its
  slow path). Counts on a device take one ``_foreach_add_`` there, one launch.
"""

from __future__ import annotations

import operator
import weakref

import torch


class TensorMirror:
    """Each step tensor's (version, value) as the host last saw or wrote it, dropped with
    the tensor (before its id can be reused)."""

    def __init__(self):
        self.seen: dict = {}  # id(tensor) -> (weak ref, version, value)

    def value(self, t: torch.Tensor) -> float:
        seen = self.seen.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == t._version:
            return seen[2]
        value = float(t)
        self.remember(t, t._version, value)
        return value

    def remember(self, t: torch.Tensor, version: int, value: float) -> None:
        """``t`` held ``value`` at ``version``."""
        key = id(t)
        seen = self.seen.get(key)
        ref = seen[0] if seen is not None and seen[0]() is t else weakref.ref(t, lambda _, k=key: self.seen.pop(k, None))
        self.seen[key] = (ref, version, value)


class GroupCounts:
    """One group's step tensors at their counts: ``by_count`` maps each count to the indices
    of the tensors at it; ``count()`` adds one to all of them."""

    def __init__(self, steps: list, mirror: TensorMirror):
        self.steps, self.mirror = steps, mirror
        # (count, dtype, device) -> [indices]: one source and one foreach call each
        groups: dict = {}
        for i, t in enumerate(steps):
            groups.setdefault((mirror.value(t), t.dtype, t.device), []).append(i)
        self.groups = [[count, dtype, device, members, [steps[i] for i in members]]
                       for (count, dtype, device), members in groups.items()]
        self.versions = [t._version for t in steps]

    def holds(self, steps: list) -> bool:
        """Whether ``steps`` are these tensors, none written since."""
        return (len(steps) == len(self.steps) and all(map(operator.is_, steps, self.steps))
                and [t._version for t in steps] == self.versions)

    def by_count(self) -> dict[float, list[int]]:
        out: dict = {}
        for count, _, _, members, _ in self.groups:
            out.setdefault(count, []).extend(members)
        return out

    def count(self) -> None:
        """``+= 1`` on every step tensor, the values and versions kept."""
        for group in self.groups:
            count, dtype, device, _, tensors = group
            source = torch.tensor(count, dtype=dtype).add_(1)
            if device.type == "cpu":
                torch._foreach_copy_(tensors, [source] * len(tensors))
            else:
                torch._foreach_add_(tensors, 1.0)
            group[0] = float(source)
        self.versions = [t._version for t in self.steps]

    def retire(self) -> None:
        """Hand the values this view keeps to the per-tensor mirror (a new view of the group
        replaces this one and reads only the tensors written since)."""
        for count, _, _, members, tensors in self.groups:
            for i, t in zip(members, tensors):
                self.mirror.remember(t, self.versions[i], count)
