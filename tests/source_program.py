"""A generated test program kept as Python source: hypothesis prints a failing example as
code a person can paste and run, and tracebacks show its lines (they go to ``linecache``)."""

from __future__ import annotations

import linecache

import torch


class SourceProgram:
    """Base of the generated programs: a subclass has ``arguments``, ``lines`` and
    ``returns``, and a ``__repr__`` that makes the arguments before ``source``."""

    tag = "program"

    @property
    def names(self) -> list[str]:
        return list("abc"[: len(self.arguments)])

    @property
    def source(self) -> str:
        """The program as a ``def program(...)``."""
        body = "\n".join(f"    {l}" for l in self.lines)
        return f"def program({', '.join(self.names)}):\n{body}\n    return ({', '.join(self.returns)},)\n"

    def _repr_pretty_(self, p, cycle) -> None:  # hypothesis' pretty-printer
        p.text(repr(self))

    def compile(self):
        name = f"<{self.tag}-{abs(hash(self.source))}>"
        linecache.cache[name] = (len(self.source), None, self.source.splitlines(True), name)
        ns = {"torch": torch, "F": torch.nn.functional}
        exec(compile(self.source, name, "exec"), ns)  # noqa: S102 (test-generated code)
        return ns["program"]
