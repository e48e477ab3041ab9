"""The package's folders are the pipeline's stages, in order: no module imports a later
stage than its own, and no import circle, counting imports inside functions and under
``TYPE_CHECKING`` (every ``import`` statement anywhere in a module).

A newcomer finds a concept's room from the tree; this test keeps the tree honest about the
direction in which the stages depend on one another.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "thunder_fuser"

# Each folder (or top-level module) and its stage, earliest first; a module may import its
# own stage or an earlier one. Leaves every stage reads: the settings, the torch-compat
# shim and the stage dumps.
STAGES = [
    ("config", "_compat", "inspect.debug"),
    ("copy_prims", "patches"),  # our primitive; what we change in thunder
    ("ir",),  # the region IR and its passes
    ("functionalize",),
    ("layout",),  # output memory layouts
    ("segment",),  # kernels and their schedule
    ("backends.reference",),
    # the CuTe DSL backend, its layers in order
    ("backends.cute.unsupported", "backends.cute.backend", "backends.cute.cache", "backends.cute.progress",
     "backends.cute.compile_workers"),
    ("backends.cute.lower",),
    ("backends.cute.tiling",),
    ("backends.cute.dsl", "backends.cute.kernel_names"),
    ("backends.cute.families",),
    ("backends.cute.legalize", "backends.cute.launch", "backends.cute.segment_kernel", "backends.cute.torch_eval"),
    ("plan",),  # the decisions for one input specialization
    ("cudagraphs",),
    ("runtime",),  # running a plan
    ("rules", "passes"),  # thunder-trace rules and passes around the regions
    ("inspect",),
    ("thunder_transforms",),
    ("optimizers",),  # torch optimizers' steps through thunder.jit
    ("executor", "attention"),
    ("",),  # the public API
]


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _in_package(name: str) -> str | None:
    """``thunder_fuser.a.b`` -> ``a.b`` (the package itself: ""), None outside it."""
    if name == "thunder_fuser":
        return ""
    return name[len("thunder_fuser."):] if name.startswith("thunder_fuser.") else None


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of the package's modules (``from pkg import name`` names the
    submodule where ``name`` is one, else ``pkg`` itself)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [s if _in_package(s) in mods else node.module for s in subs]
            for t in map(_in_package, targets):
                if t is not None and t in mods and t != m:
                    edges[m].add(t)
    return edges


def _stage(module: str) -> int:
    best = None
    for i, names in enumerate(STAGES):
        for n in names:
            if module == n or (n and module.startswith(n + ".")):
                if best is None or len(n) > best[1]:
                    best = (i, len(n))
    assert best is not None, f"thunder_fuser.{module} belongs to no stage of STAGES: give it a room"
    return best[0]


def test_no_module_imports_a_later_stage():
    mods = _modules()
    later = [f"thunder_fuser.{m or '__init__'} (stage {_stage(m)}) imports thunder_fuser.{t} (stage {_stage(t)})"
             for m, targets in _imports(mods).items() for t in sorted(targets) if _stage(t) > _stage(m)]
    assert not later, "\n".join(later)


def test_no_import_circle():
    edges = _imports(_modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_no_folder_or_module_shadows_a_public_name():
    """Importing a submodule sets it as an attribute of its package: a folder named like a
    public function (``transforms/`` beside ``transforms()``) replaced the function with the
    module once anything imported from it."""
    import importlib

    import thunder_fuser

    for name in _modules():
        if name:
            importlib.import_module(f"thunder_fuser.{name}")
    tops = {m.split(".")[0] for m in _modules() if m}
    assert not tops & set(thunder_fuser.__all__)
    for name in thunder_fuser.__all__:
        assert not isinstance(getattr(thunder_fuser, name), type(thunder_fuser)), name
