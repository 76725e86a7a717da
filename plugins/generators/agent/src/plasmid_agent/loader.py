"""Loading the user's agent function from ``--agent MODULE:FUNC`` or ``--agent ./file.py:FUNC``."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError


def load_agent(spec: str) -> Callable[..., Any]:
    """The callable that ``spec`` names: ``MODULE:FUNC`` (an importable module) or
    ``PATH.py:FUNC`` (a file, imported under a name of its own). ``FUNC`` may be dotted
    (``Class.method``). Anything that cannot be loaded, or is not callable, is a one-line
    :class:`UsageError` naming ``--agent``."""
    target, _, attribute = spec.rpartition(":")
    if not target or not attribute:
        raise UsageError(f"--agent {spec!r}: give MODULE:FUNC or ./file.py:FUNC")
    module = _load_module(spec, target)
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise UsageError(f"--agent {spec!r}: {target} has no attribute {attribute!r}")
        value = getattr(value, part)
    if not callable(value):
        raise UsageError(f"--agent {spec!r}: {attribute} is a {type(value).__name__}, not a function; "
                         f"give an `async def {attribute}(session)`")
    return value  # type: ignore[no-any-return]


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target


def absolute_spec(spec: str) -> str:
    """``spec`` with a file target made absolute (``./a.py:f`` -> ``/cwd/a.py:f``); a module spec as it is."""
    target, _, attribute = spec.rpartition(":")
    if not is_file_target(target):
        return spec
    return f"{Path(target).expanduser().resolve()}:{attribute}"


def _load_module(spec: str, target: str) -> Any:
    if is_file_target(target):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"--agent {spec!r}: no file {target}")
        name = f"plasmid_agent_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise UsageError(f"--agent {spec!r}: {target} cannot be imported as a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise UsageError(f"--agent {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise UsageError(f"--agent {spec!r}: no module {exc.name!r} (is it installed or on PYTHONPATH?)") from exc
    except Exception as exc:
        raise UsageError(f"--agent {spec!r}: importing {target} failed: {type(exc).__name__}: {exc}") from exc
