"""pytest plugin of plasmid (entry point ``pytest11``): fixtures for plugin authors."""

from __future__ import annotations

import pytest

from plasmid import testing


@pytest.fixture
def plasmid_manager():
    """A fresh plugin manager with only the kernel's plugins (no entry-point autoload)."""
    return testing.make_manager()


@pytest.fixture
def plasmid_config(tmp_path):
    """``plasmid_config(*plugins, **options)``: a configuration whose run dir is under ``tmp_path``."""

    def factory(*plugins, **options):
        options.setdefault("run_dir", tmp_path / "run")
        return testing.make_config(*plugins, **options)

    return factory
