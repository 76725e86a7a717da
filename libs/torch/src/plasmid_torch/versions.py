"""Checking that a third-party distribution a plugin adapts is installed in a tested version.

Adapters of fast-moving packages (reasoning-gym, verifiers) accept only the releases they were
tested with, and say so in one line at start-up. Called by plugins (their start-up), never by the kernel.
"""

from __future__ import annotations

import importlib.metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from plasmid.errors import UsageError


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its metadata, not its ``__version__``), or ``None``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_supported(distribution: str, version: str | None, supported: SpecifierSet, needed_by: str) -> str:
    """``version`` when it is in ``supported``; else a one-line :class:`UsageError` naming
    ``needed_by`` (the plugin) and the pip command. ``version`` is what :func:`installed_version`
    gave (``None``: not installed)."""
    install = f"pip install '{distribution}{supported}'"
    if version is None:
        raise UsageError(f"{needed_by} needs {distribution}, which is not installed; {install}")
    try:
        ok = Version(version) in supported
    except InvalidVersion:
        ok = False
    if not ok:
        raise UsageError(f"{distribution} {version} is installed but {needed_by} supports "
                         f"{distribution}{supported}; {install}")
    return version
