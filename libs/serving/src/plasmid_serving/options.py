"""The settings every engine over HTTP servers reads, whatever its option prefix.

An engine plugin's :class:`plasmid.options.Options` class mixes in :class:`ServingOptions`
before ``Options`` and sets ``prefix``; the fields this library reads (:data:`SETTINGS`) are then
declared on it as ``<prefix>_<setting>`` (``sglang_request_retries``, flag
``--sglang-request-retries``), before the class's own fields, with this module's defaults, ranges
and help texts; the class replaces a help text through ``serving_help`` (``external_addrs`` has
none here: how to start a server to attach to is the framework's), or a whole field by declaring
it itself. The engine base reads them through :meth:`ServingOptions.setting`, never by a
prefixed name.

Settings read: ``external_addrs`` (``str | None``), ``server_env`` (``tuple[str, ...]`` of
``KEY=VALUE``), ``log_dir`` (``Path | None``), ``startup_timeout``, ``request_timeout``
(seconds), ``max_concurrency``, ``request_retries``, ``max_restarts`` (counts),
``health_interval`` (seconds; 0: no monitor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from plasmid.errors import UsageError
from plasmid.options import option


@dataclass(frozen=True)
class Setting:
    """One setting every engine over HTTP servers declares as ``--<prefix>-<name>``: its type,
    default, help (``{prefix}`` is filled in) and :func:`plasmid.options.option` keywords."""

    name: str
    annotation: Any
    default: Any
    help: str
    keywords: dict[str, Any] = field(default_factory=dict)


#: The settings :class:`ServingOptions` declares on an engine's options class, in ``--help`` order.
SETTINGS = (
    Setting("external_addrs", str | None, None, "", {"metavar": "HOST:PORT,..."}),
    Setting("server_env", tuple[str, ...], (),
            "environment variable for launched servers, repeatable (CUDA_VISIBLE_DEVICES=1, ...)",
            {"metavar": "KEY=VALUE"}),
    Setting("log_dir", Path | None, None, "server logs", {"default_text": "<run dir>/{prefix}"}),
    Setting("startup_timeout", float, 900.0, "seconds a launched server may take to become healthy", {"gt": 0}),
    Setting("max_concurrency", int, 512, "requests in flight per server; more wait in this process", {"min": 1}),
    Setting("request_timeout", float, 3600.0, "seconds one generate request may take", {"gt": 0}),
    Setting("request_retries", int, 3, "times a request is sent again after its server stopped answering",
            {"min": 0}),
    Setting("health_interval", float, 10.0, "seconds between health checks of each server; 0 turns the monitor "
            "off", {"min": 0}),
    Setting("max_restarts", int, 3, "restarts of a dead launched server before it is out of service; 0 also keeps "
            "no copy of the weights for restoring", {"min": 0}),
)


class ServingOptions:
    """Mixin of an engine plugin's options class (see the module docstring)."""

    #: the option prefix without its dash (``"sglang"``)
    prefix: ClassVar[str]
    #: help texts of :data:`SETTINGS` that the engine words its own way (``external_addrs`` needs one)
    serving_help: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Declare :data:`SETTINGS` on a class that sets ``prefix``, before its own fields (then
        ``Options`` makes it a dataclass)."""
        prefix = cls.__dict__.get("prefix")
        if prefix is not None:
            own = dict(cls.__dict__.get("__annotations__", {}))
            shared: dict[str, Any] = {}
            for setting in SETTINGS:
                name = f"{prefix}_{setting.name}"
                if name in own:
                    continue
                text = cls.serving_help.get(setting.name, setting.help)
                if not text:
                    raise TypeError(f"{cls.__qualname__}: serving_help needs the help of {setting.name!r}")
                keywords: dict[str, Any] = {key: value.replace("{prefix}", prefix) if isinstance(value, str) else value
                            for key, value in setting.keywords.items()}
                shared[name] = setting.annotation
                setattr(cls, name, option(setting.default, text.replace("{prefix}", prefix), **keywords))
            cls.__annotations__ = {**shared, **own}
        super().__init_subclass__(**kwargs)

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
