"""The settings every engine over HTTP servers reads, whatever its option prefix.

An engine plugin's :class:`plasmid.options.Options` class declares its own flags (their help
texts name its framework) and mixes in :class:`ServingOptions` before ``Options``; the fields
this library reads are named ``<prefix>_<setting>`` (``sglang_request_retries``). The engine
base reads them through :meth:`ServingOptions.setting`, never by a prefixed name.

Settings read: ``external_addrs`` (``str | None``), ``server_env`` (``tuple[str, ...]`` of
``KEY=VALUE``), ``log_dir`` (``Path | None``), ``startup_timeout``, ``request_timeout``
(seconds), ``max_concurrency``, ``request_retries``, ``max_restarts`` (counts),
``health_interval`` (seconds; 0: no monitor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from plasmid.errors import UsageError


class ServingOptions:
    """Mixin of an engine plugin's options class (see the module docstring)."""

    #: the option prefix without its dash (``"sglang"``)
    prefix: ClassVar[str]

    def setting(self, name: str) -> Any:
        """The value of ``--<prefix>-<name>``."""
        return getattr(self, f"{self.prefix}_{name}")

    def flag(self, name: str) -> str:
        """``--<prefix>-<name with dashes>``, for messages."""
        return f"--{self.prefix}-{name.replace('_', '-')}"

    def check(self) -> None:
        parse_env(self.setting("server_env"), self.flag("server_env"))

    @property
    def external_addresses(self) -> list[str]:
        """``--<prefix>-external-addrs`` split at commas (empty: launch servers)."""
        given = self.setting("external_addrs") or ""
        return [address.strip() for address in given.split(",") if address.strip()]

    @property
    def server_env(self) -> dict[str, str]:
        """``--<prefix>-server-env`` as a dict."""
        return parse_env(self.setting("server_env"), self.flag("server_env"))

    def log_dir(self, run_dir: str | Path) -> Path:
        """``--<prefix>-log-dir``, or ``<run_dir>/<prefix>``."""
        given = self.setting("log_dir")
        return Path(given) if given is not None else Path(run_dir) / self.prefix


def parse_env(entries: tuple[str, ...] | list[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` entries of option ``flag`` as a dict.

    :raises UsageError: an entry without ``=`` or without a key.
    """
    env = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {entry!r}: expected KEY=VALUE")
        env[key] = value
    return env
