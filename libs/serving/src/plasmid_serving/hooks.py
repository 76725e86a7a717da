"""What the hook implementations of an engine plugin over HTTP servers do alike.

- :func:`add_engine_options` (``plasmid_addoption``): the engine's option classes, then its
  framework's settings as a generated group of options (:mod:`plasmid_serving.native_options`);
- :func:`check_external_addrs` (``plasmid_configure``): attached servers all go to one engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.kernel_options import ScheduleOptions
from plasmid.options import Options
from plasmid_serving.native_options import NativeField, add_options
from plasmid_serving.options import ServingOptions


def add_engine_options(parser: OptionParser, classes: Iterable[type[Options]], *, prefix: str, label: str,
                       native: str, fields: Iterable[NativeField], plasmid_defaults: Mapping[str, str]) -> None:
    """Declare ``classes``, then ``fields`` in group ``"<prefix> native"``, whose heading reads
    ``<native>, generated from the installed version; unset means <label>'s default, or plasmid's
    for: <field> (<why>); ...`` (``plasmid_defaults``: the fields plasmid sets when not given)."""
    for cls in classes:
        parser.add_options(cls)
    group = parser.getgroup(f"{prefix} native", f"{native}, generated from the installed version; unset means "
                            f"{label}'s default, or plasmid's for: "
                            + "; ".join(f"{name} ({why})" for name, why in plasmid_defaults.items()))
    add_options(group, fields)


def check_external_addrs(config: Config, options: type[ServingOptions]) -> None:
    """:raises UsageError: the run's engine is ``options.prefix`` and attaches to servers
    (``--<prefix>-external-addrs``) with ``--engines`` other than 1."""
    prefix = options.prefix
    if config.option.engine != prefix:
        return
    values = options.of(config)  # type: ignore[attr-defined]  # an Options subclass
    if values.external_addresses and ScheduleOptions.of(config).engines != 1:
        raise UsageError(f"--{prefix}-external-addrs gives every server to one engine, which balances requests over "
                         f"them; use --engines 1 with it (plugin {prefix})")
