"""What every benchmark command shares: a ``--help`` that gives the command's purpose and
each option's meaning and default, and one line, never a traceback, where a command needs a
CUDA GPU the machine lacks."""

from __future__ import annotations

import argparse
import sys


class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown beside each option; the description's own line breaks kept."""


def parser(module: str, doc: str | None, epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m <module>``, described by the module's docstring."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc, epilog=epilog, formatter_class=_Help)


def require_cuda(module: str, instead: str = "") -> None:
    """Exit (status 1) with one line where torch sees no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"python -m {module} needs a CUDA GPU; torch {torch.__version__} sees none here."
                 + (f" {instead}" if instead else ""))


def write_results(path: str, doc: dict, table) -> int:
    """Write a benchmark's results JSON to ``path`` and print ``table(doc)``; 0, the exit status."""
    import json

    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(table(doc))
    return 0
