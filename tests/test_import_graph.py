"""The import graph of the first-party packages: a plugin imports the kernel, its own module and
the shared libraries under ``libs/``, never another plugin's module; the kernel imports none of them.

Read from the sources with :mod:`ast` (nothing is imported): every ``import`` / ``from ... import``
(inside functions too), every lazy provider string ``"plasmid_xxx.module:Attr"`` (what
``register(name, "module:Attr")`` loads later), and every module named as a string to
``importlib.import_module`` / ``__import__``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "core" / "src" / "plasmid"
#: ``"plasmid_xxx.module:Attr"``: a provider registered lazily by its import path.
PROVIDER_STRING = re.compile(r"^plasmid_[a-z_]+(\.[a-z_0-9]+)*:")
#: A dotted module path of a first-party package as a plain string (``"plasmid_torch.testing"``).
MODULE_STRING = re.compile(r"^plasmid_[a-z_0-9]+(\.[a-z_0-9]+)+$")
#: The one place where the kernel names a library: the lazy re-export table of plasmid.testing.
FAMILY_TABLE = KERNEL / "families.py"


def _packages(pattern: str) -> list[Path]:
    return sorted(path for path in ROOT.glob(pattern) if path.is_dir() and (path / "__init__.py").is_file())


LIBRARIES = {path.name for path in _packages("libs/*/src/*")}
PLUGINS = _packages("plugins/*/*/src/*")


def references(path: Path, *, module_strings: bool = False) -> list[tuple[int, str]]:
    """``(line, module)`` for every module that ``path`` imports or names for a lazy import."""
    return sorted(set(_references(path, module_strings)))


def _references(path: Path, module_strings: bool) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:  # relative imports stay inside the package
                yield node.lineno, node.module
        elif isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name in ("import_module", "__import__") and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    yield node.lineno, first.value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if PROVIDER_STRING.match(node.value):
                yield node.lineno, node.value.split(":", 1)[0]
            elif module_strings and MODULE_STRING.match(node.value):
                yield node.lineno, node.value


def first_party(module: str) -> str | None:
    """The top-level ``plasmid_*`` package of ``module``, or None (the kernel, third-party modules)."""
    top = module.split(".", 1)[0]
    return top if top.startswith("plasmid_") else None


def reexport_table() -> set[str]:
    """The library modules the family table names for ``plasmid.testing`` to re-export lazily: the
    ``contract`` column of ``plasmid.families.FAMILIES`` and ``TESTING_EXTRAS`` (``"module:attr"``)."""
    from plasmid.families import FAMILIES, TESTING_EXTRAS

    modules = {family.contract.partition(":")[0] for family in FAMILIES if family.contract}
    modules |= {target.partition(":")[0] for target in TESTING_EXTRAS.values()}
    return modules | {module.rpartition(".")[0] for module in modules}   # and the package they are in


def test_the_packages_are_found():
    assert "plasmid_torch" in LIBRARIES
    assert len(PLUGINS) >= 10, PLUGINS


@pytest.mark.parametrize("package", PLUGINS, ids=lambda path: path.name)
def test_a_plugin_imports_only_the_kernel_itself_and_the_libraries(package):
    allowed = LIBRARIES | {package.name}
    foreign = []
    for path in sorted(package.rglob("*.py")):
        for line, module in references(path):
            top = first_party(module)
            if top is not None and top not in allowed:
                foreign.append(f"{path.relative_to(ROOT)}:{line}: {module} (plugin {top})")
    assert not foreign, (f"plugin {package.name} uses another plugin's module (a plugin may use the kernel, its "
                         f"own module and the libraries under libs/: {sorted(LIBRARIES)}):\n" + "\n".join(foreign))


def test_the_kernel_imports_no_plugin_or_library():
    table = reexport_table()
    found = []
    for path in sorted(KERNEL.rglob("*.py")):
        for line, module in references(path, module_strings=True):
            top = first_party(module)
            if top is None:
                continue
            if path == FAMILY_TABLE and module in table and top in LIBRARIES:
                continue  # where a library's contract suite lives (re-exported lazily by plasmid.testing)
            found.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not found, ("the kernel (core/src/plasmid) must not import plugins or libraries; only the family "
                       "table's contract column (plasmid/families.py) may name a library:\n" + "\n".join(found))


def test_the_reexport_table_names_the_torch_contracts_in_the_library():
    table = reexport_table()
    for family in ("trainer", "generator", "loss", "weightsync"):
        assert f"plasmid_torch.testing.contracts.{family}" in table, table
