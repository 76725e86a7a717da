"""The kernel and the application apart (issue 31): the kernel is small, never imports the
application, and neither has an import circle. Checked statically, from the source (ast), so a
lazy import inside a function counts like one at the top.

The kernel is every module of ``plasmid`` outside ``plasmid.app`` (the application: the CLI and
its commands) and ``plasmid.testing`` (the testing kit for plugin authors).
"""

from __future__ import annotations

import ast
from pathlib import Path

import plasmid

PACKAGE = Path(plasmid.__file__).parent

#: The kernel's size limit, in lines of source (see :func:`source_lines` for what counts).
KERNEL_LINE_LIMIT = 5000

def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for path in PACKAGE.rglob("*.py")}
APP = {name for name in MODULES if name == "plasmid.app" or name.startswith("plasmid.app.")}
TESTING = {name for name in MODULES if name == "plasmid.testing" or name.startswith("plasmid.testing.")}
KERNEL = set(MODULES) - APP - TESTING


def imports(name: str) -> set[str]:
    """Every ``plasmid`` module that module ``name`` imports, anywhere in it (a function's lazy
    import and ``if TYPE_CHECKING`` included); ``from plasmid.x import y`` counts ``plasmid.x``
    and, when ``y`` is a module, ``plasmid.x.y``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {other for other in found if other in MODULES and other != name}


def source_lines(path: Path) -> int:
    """The counting rule: every line that is neither blank nor only a comment (docstrings count)."""
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip() and not line.strip().startswith("#"))


def graph_of(modules: set[str]) -> dict[str, set[str]]:
    """``{module: the modules among modules it imports}``."""
    return {name: imports(name) & modules for name in modules}


def circle(graph: dict[str, set[str]]) -> list[str]:
    """An import circle of ``graph`` (module -> the modules it imports), or ``[]``."""
    state: dict[str, str] = {}

    def walk(name: str, trail: list[str]) -> list[str]:
        state[name] = "open"
        for other in sorted(graph[name]):
            if state.get(other) == "open":
                return [*trail[trail.index(other):], other]
            if other not in state and (found := walk(other, [*trail, other])):
                return found
        state[name] = "done"
        return []

    for name in sorted(graph):
        if name not in state and (found := walk(name, [name])):
            return found
    return []


def test_the_parts_are_found():
    assert {"plasmid.config", "plasmid.loop", "plasmid.hookspecs", "plasmid.plugins"} <= KERNEL
    assert {"plasmid.app.cli", "plasmid.app.run", "plasmid.app.configfile", "plasmid.app.replay"} <= APP


def test_the_kernel_is_at_most_5000_lines():
    counts = {name: source_lines(MODULES[name]) for name in KERNEL}
    total = sum(counts.values())
    largest = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda item: -item[1])[:5])
    assert total <= KERNEL_LINE_LIMIT, f"the kernel has {total} lines (largest: {largest})"


def test_no_kernel_module_imports_the_application():
    found = {name: sorted(imports(name) & APP) for name in sorted(KERNEL)}
    assert not {name: app for name, app in found.items() if app}


def test_the_kernel_has_no_import_circle():
    found = circle(graph_of(KERNEL))
    assert not found, "import circle in the kernel: " + " -> ".join(found)


def test_the_application_has_no_import_circle():
    found = circle(graph_of(APP))
    assert not found, "import circle in the application: " + " -> ".join(found)


def test_the_circle_check_finds_one():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert "plasmid.app.run" in imports("plasmid.app.cli")   # imported inside cmd_train
