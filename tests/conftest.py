"""Fixtures of the cross-package tests (helpers live in plasmid_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from plasmid_e2e import install_to_target


@pytest.fixture(scope="session")
def broken_plugins(tmp_path_factory) -> Path:
    """A directory holding rl-plugin-broken, rl-plugin-oldapi and rl-plugin-badhook, installed;
    put it on PYTHONPATH of a subprocess to make them 'installed' there."""
    target = tmp_path_factory.mktemp("broken_plugins")
    for package in ("rl-plugin-broken", "rl-plugin-oldapi", "rl-plugin-badhook"):
        install_to_target(package, target)
    return target
