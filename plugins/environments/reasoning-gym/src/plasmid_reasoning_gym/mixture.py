"""A weighted mixture of reasoning-gym datasets, split into training and held-out eval entries.

Parsing (:func:`parse_mixture`): ``--rg-dataset NAME[:WEIGHT]`` (weight a positive finite number,
default 1; a name given twice is an error) and ``--rg-config NAME.KEY=VALUE`` (NAME one of the
chosen datasets, KEY a field of its config dataclass other than ``seed``/``size``, which
``--rg-seed``/``--rg-size`` set; VALUE JSON when it parses, ``@PATH`` a YAML or JSON file, else
the string). reasoning-gym's ``composite`` is configured the same way: its ``datasets`` field is a
list of ``{"name", "weight", "config"}`` (:func:`plasmid_reasoning_gym.gym.composite_datasets`), given
inline as JSON or from a file, e.g. ``--rg-dataset composite --rg-config composite.datasets=@mix.yaml``.
Every dataset is built once here, so a config reasoning-gym rejects fails at start-up, in one line.

A split (:class:`Split`) of ``size`` entries: each dataset of the mixture is generated with
``size`` entries and a seed derived from (``--rg-seed``, split, dataset name); entry ``k`` of the
split is entry ``k`` of the dataset that a weighted draw keyed by (seed, split, ``k``) picks (a
one-dataset mixture draws nothing). The ``train`` and ``eval`` splits differ only in the split
name, so the eval split comes from different seeds. Every derivation is a string-keyed hash or
``random.Random(str)``, the same in every process and on every platform.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any

from plasmid.errors import UsageError
from plasmid_reasoning_gym import gym

#: Config fields set by plasmid's own options, never by ``--rg-config``.
RESERVED_KEYS = {"seed": "--rg-seed", "size": "--rg-size"}


@dataclass(frozen=True)
class Component:
    """One dataset of the mixture: its name, weight and ``--rg-config`` fields (JSON values)."""

    name: str
    weight: float
    config: dict[str, Any]


def parse_mixture(datasets: tuple[str, ...], configs: tuple[str, ...]) -> list[Component]:
    """The mixture that ``--rg-dataset`` and ``--rg-config`` describe; one-line :class:`UsageError`
    on a bad name, weight, key or value (close matches listed)."""
    if not datasets:
        raise UsageError("--rg-dataset: give at least one reasoning-gym dataset NAME[:WEIGHT]")
    weights: dict[str, float] = {}
    for text in datasets:
        name, _, weight_text = text.partition(":")
        gym.check_dataset_name(name)
        if name in weights:
            raise UsageError(f"--rg-dataset {text!r}: {name} is given twice; give each dataset once with its weight")
        try:
            weight = float(weight_text) if weight_text else 1.0
        except ValueError:
            raise UsageError(f"--rg-dataset {text!r}: the weight after ':' must be a number") from None
        if not (math.isfinite(weight) and weight > 0):
            raise UsageError(f"--rg-dataset {text!r}: the weight after ':' must be a positive finite number")
        weights[name] = weight
    fields: dict[str, dict[str, Any]] = {name: {} for name in weights}
    for text in configs:
        target, equals, value_text = text.partition("=")
        name, dot, key = target.partition(".")
        if not (equals and dot and name and key):
            raise UsageError(f"--rg-config {text!r}: expected NAME.KEY=VALUE (e.g. basic_arithmetic.max_terms=3)")
        if name not in fields:
            hint = gym.close_matches(name, list(fields))
            raise UsageError(f"--rg-config {text!r}: {name} is not one of the --rg-dataset datasets "
                             f"({', '.join(fields)}){hint}")
        if key in RESERVED_KEYS:
            raise UsageError(f"--rg-config {text!r}: {key} is set by {RESERVED_KEYS[key]}, not --rg-config")
        known = [field for field in gym.config_fields(name) if field not in RESERVED_KEYS]
        if key not in known:
            hint = gym.close_matches(key, known) or f"; its fields are {', '.join(known)}"
            raise UsageError(f"--rg-config {text!r}: {name} has no config field {key!r}{hint}")
        value = config_value(text, value_text)
        if name == gym.COMPOSITE and key == "datasets":
            try:
                value = gym.composite_datasets(value)
            except ValueError as exc:
                raise UsageError(f"--rg-config {text!r}: {exc}") from None
        fields[name][key] = value
    mixture = [Component(name, weight, fields[name]) for name, weight in weights.items()]
    for component in mixture:  # reasoning-gym checks the values when a dataset is built
        try:
            gym.dataset(component.name, {**component.config, "seed": 0, "size": 1})
        except Exception as exc:  # noqa: BLE001 - reasoning-gym raises assertions, TypeErrors, ValueErrors
            given = " ".join(f"{component.name}.{key}={json.dumps(value)}" for key, value in component.config.items())
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"--rg-config {given or '(none)'}: reasoning-gym rejects the config of "
                             f"{component.name}: {reason}") from None
    return mixture


def config_value(text: str, value_text: str) -> Any:
    """The value of ``--rg-config`` ``text``: ``@PATH`` is the YAML (or JSON) file at ``PATH``, read
    now; else JSON when ``value_text`` parses as JSON, else the string. A file that cannot be read
    or parsed is a one-line :class:`UsageError`."""
    if value_text.startswith("@"):
        import yaml

        path = value_text[1:]
        try:
            with open(path, encoding="utf-8") as stream:
                return json.loads(json.dumps(yaml.safe_load(stream)))
        except (OSError, yaml.YAMLError, TypeError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"--rg-config {text!r}: cannot read {path} as YAML or JSON ({reason})") from None
    try:
        return json.loads(value_text)
    except ValueError:
        return value_text


def derived_seed(*parts: object) -> int:
    """A 32-bit seed from ``parts`` (string-keyed BLAKE2: stable across processes)."""
    digest = hashlib.blake2b(":".join(str(part) for part in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 2**32


class Split:
    """``size`` entries of a mixture (see the module docstring); ``locate(k)`` says where entry
    ``k`` comes from, ``entry(k)`` generates it.

    :ivar key: identifies the split's entries (mixture, configs, seed, size); stored with resume state.
    """

    def __init__(self, mixture: list[Component], *, split: str, size: int, seed: int) -> None:
        self.split, self.size, self.seed = split, size, seed
        self.names = [component.name for component in mixture]
        self.weights = [component.weight for component in mixture]
        self.configs = {component.name: {**component.config, "seed": derived_seed(seed, split, component.name),
                                         "size": size} for component in mixture}
        self.key = gym.config_key({"split": split, "size": size, "seed": seed,
                                   "mixture": [[component.name, component.weight, component.config]
                                               for component in mixture]})

    def locate(self, k: int) -> tuple[str, int]:
        """``(dataset name, index in that dataset)`` of entry ``k`` (``0 <= k < size``)."""
        if not 0 <= k < self.size:
            raise IndexError(f"entry {k} outside the {self.split} split of {self.size}")
        if len(self.names) == 1:
            return self.names[0], k
        draw = random.Random(f"rg-mixture:{self.seed}:{self.split}:{k}")
        return draw.choices(self.names, weights=self.weights, k=1)[0], k

    def label(self, k: int) -> dict[str, Any]:
        """What the reward needs to rebuild entry ``k`` exactly: dataset, config, index (JSON)."""
        name, index = self.locate(k)
        return {"dataset": name, "config": dict(self.configs[name]), "index": index}

    def entry(self, k: int) -> dict[str, Any]:
        """Entry ``k``: reasoning-gym's ``{"question", "answer", "metadata"}``."""
        name, index = self.locate(k)
        entry: dict[str, Any] = gym.dataset(name, self.configs[name])[index]
        return entry


def entry_of_label(label: Any) -> tuple[Any, dict[str, Any]]:
    """``(dataset, entry)`` for a label made by :meth:`Split.label`, or a label that carries the
    entry itself (``{"dataset": NAME, "entry": {...}}``, as exported elsewhere); ``ValueError``
    for anything else."""
    if not isinstance(label, dict) or not isinstance(label.get("dataset"), str):
        raise ValueError(f"the label {label!r:.80} is not a reasoning-gym entry; expected the reasoning-gym data "
                         f"source's label {{'dataset', 'config', 'index'}} (or {{'dataset', 'entry'}})")
    name = label["dataset"]
    if "entry" in label:
        return gym.dataset(name, {"seed": 0, "size": 1}), label["entry"]
    if not isinstance(label.get("config"), dict) or not isinstance(label.get("index"), int):
        raise ValueError(f"the reasoning-gym label of {name} has no 'config' and 'index' (or 'entry')")
    dataset = gym.dataset(name, label["config"])
    return dataset, dataset[label["index"]]
