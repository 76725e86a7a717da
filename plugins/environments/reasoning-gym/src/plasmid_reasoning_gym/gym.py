"""The one place that talks to the reasoning-gym package: its version, its datasets, its scorers.

:func:`check_version` is the start-up check (the plugin's ``plasmid_configure`` runs it when the
data source or the reward is chosen, and both providers run it when built): a missing or
unsupported reasoning-gym is one :class:`~plasmid.errors.UsageError` line with the pip command.
``reasoning_gym.__version__`` is not maintained upstream (0.1.25 says 0.1.19), so the installed
distribution's metadata is what is checked.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import fields, is_dataclass
from typing import Any

from packaging.specifiers import SpecifierSet

from plasmid.errors import UsageError
from plasmid_torch import versions

#: The reasoning-gym releases this adapter is tested with: the one bound, checked at start-up here and
#: declared alike in pyproject.toml, requirements/environments.txt and the README (test_rg_options checks it).
SUPPORTED = SpecifierSet(">=0.1.25,<0.1.26")
DISTRIBUTION = "reasoning-gym"


def installed_version() -> str | None:
    """The installed reasoning-gym version (its metadata), or ``None`` when it is not installed."""
    return versions.installed_version(DISTRIBUTION)


def check_version() -> str:
    """The installed version when it is supported; else a one-line :class:`UsageError`."""
    return versions.check_supported(DISTRIBUTION, installed_version(), SUPPORTED, "plasmid-reasoning-gym")


def registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's datasets: name -> (dataset class, config dataclass)."""
    check_version()
    import reasoning_gym  # noqa: F401 - importing it registers every dataset
    from reasoning_gym.factory import DATASETS

    return DATASETS


def dataset_names() -> list[str]:
    return sorted(registry())


def close_matches(word: str, choices: list[str]) -> str:
    """``"; did you mean a, b?"`` for the choices close to ``word``, else ``""``."""
    near = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f"; did you mean {', '.join(near)}?" if near else ""


def check_dataset_name(name: str, flag: str = "--rg-dataset") -> None:
    names = dataset_names()
    if name not in names:
        hint = close_matches(name, names) or f"; {len(names)} datasets, e.g. {', '.join(names[:5])}"
        raise UsageError(f"{flag} {name!r}: reasoning-gym has no such dataset{hint}")


def config_fields(name: str) -> list[str]:
    """The fields of dataset ``name``'s config dataclass."""
    config_cls = registry()[name][1]
    return [item.name for item in fields(config_cls)] if is_dataclass(config_cls) else []


def config_key(config: dict[str, Any]) -> str:
    """A canonical text of a dataset config (cache key, part of the stream's identity)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


#: The dataset of reasoning-gym that mixes others; its ``datasets`` field is a list of specs.
COMPOSITE = "composite"


def composite_datasets(value: Any) -> list[dict[str, Any]]:
    """``composite``'s ``datasets`` field as plain specs ``[{"name", "weight", "config"}, ...]``
    (``config`` filled in as ``{}`` where left out), from a list of such mappings or a mapping with
    the list under ``datasets`` (reasoning-gym's composite YAML). Anything else is a ``ValueError``
    saying what a spec is; names, weights and configs are reasoning-gym's to check."""
    if isinstance(value, dict) and "datasets" in value:
        value = value["datasets"]
    if not isinstance(value, list) or not value:
        raise ValueError(f"composite.datasets must be a non-empty list of {{name, weight, config}}, got {value!r:.80}")
    specs = []
    for spec in value:
        keys = set(spec) if isinstance(spec, dict) else set()
        if not isinstance(spec, dict) or keys - {"name", "weight", "config"} or not {"name", "weight"} <= keys:
            raise ValueError(f"composite.datasets holds {spec!r:.80}; each is {{name, weight, config}} (config "
                             f"optional)")
        specs.append({"name": spec["name"], "weight": spec["weight"], "config": spec.get("config", {})})
    return specs


@functools.lru_cache(maxsize=256)
def _dataset(name: str, key: str) -> Any:
    from reasoning_gym.factory import create_dataset

    config = json.loads(key)
    if name == COMPOSITE and "datasets" in config:
        from reasoning_gym.composite import DatasetSpec

        config["datasets"] = [DatasetSpec(**spec) for spec in composite_datasets(config["datasets"])]
    return create_dataset(name, **config)


def dataset(name: str, config: dict[str, Any]) -> Any:
    """The reasoning-gym dataset ``name`` built with ``config`` (JSON values, ``seed`` and ``size``
    included; ``composite``'s ``datasets`` as plain specs, :func:`composite_datasets`); one instance
    per distinct config, shared (datasets are read-only once built: an
    entry is a pure function of the config and its index)."""
    registry()
    return _dataset(name, config_key(config))
