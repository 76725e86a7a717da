"""pytest plugin of plasmid (entry point ``pytest11``): fixtures for plugin authors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plasmid import testing
from plasmid.config import Config
from plasmid.plugins import PluginManager


@pytest.fixture
def plasmid_manager() -> PluginManager:
    """A fresh plugin manager with only the kernel's plugins (no entry-point autoload)."""
    return testing.make_manager()


@pytest.fixture
def plasmid_config(tmp_path: Path) -> Callable[..., Config]:
    """``plasmid_config(*plugins, **options)``: a configuration whose run dir is under ``tmp_path``."""

    def factory(*plugins: Any, **options: Any) -> Config:
        options.setdefault("run_dir", tmp_path / "run")
        return testing.make_config(*plugins, **options)

    return factory
