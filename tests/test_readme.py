"""The README's recommended call runs as printed and prints what the README shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(section: str) -> tuple[str, str]:
    """The section's first ```python block and the plain ``` block after it (its output)."""
    text = README.read_text()
    body = text[text.index(f"## {section}"):]
    body = body[:body.index("\n## ", 4)]
    code = re.search(r"```python\n(.*?)```", body, re.S).group(1)
    after = body[body.index(code) + len(code) + len("```"):]
    output = re.search(r"```\n(.*?)```", after, re.S).group(1)
    return code, output


def _assert_prints_what_the_readme_shows(section: str) -> None:
    code, shown = _blocks(section)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    printed = out.getvalue().splitlines()
    at = 0
    for line in shown.splitlines():  # in order; "..." stands for lines left out
        if line.strip() == "...":
            continue
        assert line in printed[at:], f"README shows {line!r}, not printed after line {at}:\n" + "\n".join(printed)
        at = printed.index(line, at) + 1


def test_the_recommended_call_prints_what_the_readme_shows():
    _assert_prints_what_the_readme_shows("The recommended call")


def test_the_training_loop_prints_what_the_readme_shows():
    _assert_prints_what_the_readme_shows("A training loop")
