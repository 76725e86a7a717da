"""A training run's ``config.json`` read by the commands that use a run without training it:
``plasmid eval``, ``plasmid score`` and ``plasmid rollout``.

``--checkpoint DIR`` (a run directory, or a checkpoint ``<run>/checkpoints/step_N``) makes the
command read the run's ``config.json`` as if it were the first ``--config`` file
(:func:`with_run_config`): the run's data source and its options (the eval split, the chat
template), ``--max-new-tokens``, the rewards and every other option the command has come from the
run; a later ``--config`` file overrides them and the command line overrides both.

A run's ``config.json`` holds options of ``plasmid train`` (and of the plugins loaded then) that
these commands may not have: read by :class:`RunConfigFiles` (given as ``--config`` or found by
``--checkpoint``) those keys are ignored instead of refused, and so are the keys that name where
that run wrote (:data:`PLACE_KEYS`: its run directory, its saved rollouts, its resume), which a
command using the run must not write into. Any other ``--config`` file is read as by
``plasmid train``, unknown keys refused.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from plasmid.app import configfile
from plasmid.checkpoint import Checkpoints
from plasmid.config import ConfigFiles
from plasmid.errors import UsageError
from plasmid.plugins import installed_entry_points

#: The name of the file a run writes its configuration to.
CONFIG_NAME = "config.json"

#: Options of a run's ``config.json`` that name where that run wrote; never read from it by these commands.
PLACE_KEYS = frozenset({"run_dir", "resume", "resume_allow_changes", "save_rollouts"})


#: Per built-in data source, the options that name its split of prompts, for the evaluation and the training
#: split (:func:`data_text`); a data source not listed is named alone.
SPLIT_OPTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "hf": {"eval": ("hf_path", "hf_eval_split"), "train": ("hf_path", "hf_split")},
    "jsonl": {"eval": ("eval_prompt_data",), "train": ("prompt_data",)},
    "tasks": {"eval": ("task",), "train": ("task",)},
}


def data_text(option: argparse.Namespace, split: str) -> str:
    """What a command reads, as its start-up line shows it: ``data source hf (hf_path=gsm8k,
    hf_eval_split=test)``, from the options ``option`` of a run; ``split`` is ``"eval"`` or ``"train"``."""
    source = str(getattr(option, "datasource", None))
    named = [f"{name}={getattr(option, name)}" for name in SPLIT_OPTIONS.get(source, {}).get(split, ())
             if getattr(option, name, None) is not None]
    return f"data source {source}" + (f" ({', '.join(named)})" if named else "")


def is_run_config(path: str | Path) -> bool:
    """Whether ``path`` is a run's ``config.json`` (a JSON object with ``option`` and
    ``plugin_lock``); ``False`` for anything unreadable (which the reader reports itself)."""
    path = Path(path)
    if path.suffix.lower() != ".json":
        return False
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("option"), dict) and "plugin_lock" in data


class RunConfigFiles:
    """The ``--config`` reader (:class:`plasmid.config.ConfigFiles`) of ``plasmid eval``, ``score``
    and ``rollout``: ``inner`` (the reader ``train`` uses, :mod:`plasmid.app.configfile`), except
    that a run's ``config.json`` contributes only the keys the command has, less
    :data:`PLACE_KEYS` (module docstring)."""

    def __init__(self, inner: ConfigFiles | None = None) -> None:
        self.inner: ConfigFiles = configfile if inner is None else inner

    def plugins_in(self, paths: list[str]) -> str | None:
        """The plugin selection of the files, as ``inner`` reads it."""
        return self.inner.plugins_in(paths)

    def values(self, path: str, options: set[str], sections: set[str]) -> dict[str, Any]:
        """``{destination: value}`` of the file at ``path``; a run's ``config.json`` keeps the keys
        among ``options`` (less :data:`PLACE_KEYS`), any other file is read by ``inner``."""
        if not is_run_config(path):
            return self.inner.values(path, options, sections)
        data = configfile.read_file(path)
        kept = {key: value for key, value in data.items()
                if key.replace("-", "_") in options and key.replace("-", "_") not in PLACE_KEYS}
        return configfile.flatten(kept, options, sections | set(installed_entry_points()), path)


def run_of(checkpoint: Path) -> Path:
    """The run directory of ``--checkpoint``: the directory itself when it holds ``checkpoints/``
    or a ``config.json``, the run above ``<run>/checkpoints/step_N`` for a checkpoint; one-line
    errors otherwise."""
    if not checkpoint.is_dir():
        raise UsageError(f"--checkpoint {checkpoint}: no such directory")
    if (checkpoint / "checkpoints").is_dir() or (checkpoint / CONFIG_NAME).is_file():
        return checkpoint
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent
    raise UsageError(f"--checkpoint {checkpoint}: neither a run directory (with checkpoints/) nor a checkpoint "
                     f"(<run>/checkpoints/step_N)")


def model_of(checkpoint: Path) -> Path:
    """The model directory of ``--checkpoint``: ``trainer/model`` of the checkpoint, or of the
    run's newest complete checkpoint for a run directory; one-line errors."""
    if not checkpoint.is_dir():
        raise UsageError(f"--checkpoint {checkpoint}: no such directory")
    if (checkpoint / "checkpoints").is_dir():
        latest = Checkpoints(checkpoint).latest()
        if latest is None:
            raise UsageError(f"--checkpoint {checkpoint}: the run directory holds no complete checkpoint")
        checkpoint = latest
    model = checkpoint / "trainer" / "model"
    if not model.is_dir():
        raise UsageError(f"--checkpoint {checkpoint}: no trainer/model directory in it (give a checkpoint "
                         f"step_N directory, a run directory, or --model DIR)")
    return model


def run_config_of(checkpoint: Path) -> Path:
    """The ``config.json`` of the run that ``--checkpoint`` names (:func:`run_of`); a one-line
    error when the run has none, or it is not a run's configuration."""
    path = run_of(checkpoint) / CONFIG_NAME
    if not path.is_file():
        raise UsageError(f"--checkpoint {checkpoint}: its run has no {CONFIG_NAME} ({path}), so the run's data "
                         f"source, rewards and lengths are unknown; give the checkpoint's model as --model "
                         f"{model_of(checkpoint)} with the options to evaluate it")
    if not is_run_config(path):
        raise UsageError(f"--checkpoint {checkpoint}: {path} is not a run's configuration (a JSON object with "
                         f"'option' and 'plugin_lock')")
    return path


def checkpoint_argument(argv: list[str]) -> tuple[str | None, str | None]:
    """``(--checkpoint, --model)`` as ``argv`` gives them (``@files`` included), each ``None`` when absent."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False, fromfile_prefix_chars="@")
    early.add_argument("--checkpoint", default=None)
    early.add_argument("--model", default=None)
    try:
        known, _ = early.parse_known_args(argv)
    except OSError as exc:
        raise UsageError(f"cannot read an @file of the arguments: {exc}") from None
    return known.checkpoint, known.model


def with_run_config(argv: list[str], *, model: bool = True) -> list[str]:
    """``argv`` with what ``--checkpoint DIR`` implies: the run's ``config.json`` as the first
    ``--config`` (so later files and the command line win) and, with ``model``, ``--model`` set to
    the checkpoint's model unless ``argv`` gives one. ``argv`` unchanged without ``--checkpoint``."""
    checkpoint, given_model = checkpoint_argument(argv)
    if checkpoint is None:
        return list(argv)
    found = model_of(Path(checkpoint)) if model and given_model is None else None
    out = ["--config", str(run_config_of(Path(checkpoint))), *argv]
    return out if found is None else [*out, "--model", str(found)]


__all__ = ["CONFIG_NAME", "PLACE_KEYS", "SPLIT_OPTIONS", "RunConfigFiles", "checkpoint_argument", "data_text",
           "is_run_config", "model_of", "run_config_of", "run_of", "with_run_config"]
