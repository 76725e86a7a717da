"""The kernel's modules import each other without a circle, counting type-checking imports too."""

from __future__ import annotations

import ast
from pathlib import Path

import plasmid

KERNEL = Path(plasmid.__file__).parent


def _module(path: Path) -> str:
    parts = list(path.relative_to(KERNEL.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(path): path for path in KERNEL.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """Kernel modules ``path`` imports at module level or under ``if TYPE_CHECKING``."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                visit(node.body)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("plasmid"):
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.startswith("plasmid"))

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return {name for name in found if name in MODULES and name != "plasmid"}


def test_no_kernel_module_imports_itself_back_through_others():
    graph = {name: _imports(path) - {name} for name, path in MODULES.items()}
    state: dict[str, str] = {}
    cycle: list[str] = []

    def walk(name: str, trail: list[str]) -> bool:
        state[name] = "open"
        for other in sorted(graph[name]):
            if state.get(other) == "open":
                cycle.extend(trail[trail.index(other):] + [other])
                return True
            if other not in state and walk(other, [*trail, other]):
                return True
        state[name] = "done"
        return False

    for name in sorted(graph):
        if name not in state and walk(name, [name]):
            break
    assert not cycle, "import circle in the kernel: " + " -> ".join(cycle)
