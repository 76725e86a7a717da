"""Saved rollouts: what ``--save-rollouts DIR`` writes (:func:`saving`, for ``plasmid train`` and
``plasmid rollout``) and ``plasmid replay DIR`` reads.

Format (``FORMAT_NAME``, version :data:`FORMAT_VERSION`): one file per rollout step,
``DIR/step_NNNNNN.jsonl`` (six digits, the rollout id), written atomically (a crash never leaves
a half-written step file). Each file is JSON Lines, UTF-8:

- line 1, the header: ``{"format": "plasmid-rollouts", "version": 1, "rollout_id": N,
  "groups": G, "metrics": {...}}`` (the driver's metrics of the step);
- lines 2 to G+1, one group each: ``{"index": I, "samples": [SAMPLE, ...]}``, in batch order.

A SAMPLE object holds every field of :class:`plasmid.types.Sample`: ``prompt`` (text or chat
messages), ``tokens`` (prompt and response ids), ``response``, ``response_length``,
``loss_mask`` (list of 0/1 aligned with the response, or null), ``rollout_logprobs`` (list of
floats, or null), ``reward``, ``reward_components`` (name -> float), ``label``, ``metadata``,
``status`` (a :class:`plasmid.types.Status` value), ``weight_version``, ``index``,
``group_index``. Floats are written by Python's ``repr`` (``NaN``/``Infinity`` as JSON's
extension), so they read back bit for bit. Values of ``label`` and ``metadata`` that JSON cannot
hold are written as lists (arrays) or their ``str``.

A reader accepts files of the same format name whose version is at most
:data:`FORMAT_VERSION`; anything else is a :class:`~plasmid.errors.PlasmidError` naming the file
and line.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

from plasmid.atomic import write_atomic
from plasmid.config import Config, OptionParser
from plasmid.errors import DataExhausted, PlasmidError, UsageError
from plasmid.options import Options, option
from plasmid.protocols import RolloutDriver, RolloutView
from plasmid.types import Group, RolloutBatch, Sample, SamplingParams, Status

FORMAT_NAME = "plasmid-rollouts"
FORMAT_VERSION = 1
SAMPLE_FIELDS = tuple(f.name for f in fields(Sample))


def step_path(root: Path, rollout_id: int) -> Path:
    """Where step ``rollout_id``'s file lives under ``root``."""
    return Path(root) / f"step_{rollout_id:06d}.jsonl"


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def encode_sample(sample: Sample) -> dict[str, Any]:
    """``sample`` as the SAMPLE object of the module docstring."""
    data = {name: getattr(sample, name) for name in SAMPLE_FIELDS}
    data["status"] = str(sample.status)
    return data


def decode_sample(data: dict[str, Any], where: str) -> Sample:
    """The :class:`Sample` a SAMPLE object holds; a missing or unknown field names ``where``."""
    if not isinstance(data, dict):
        raise PlasmidError(f"{where}: a sample is not a JSON object")
    unknown = sorted(set(data) - set(SAMPLE_FIELDS))
    missing = sorted(set(SAMPLE_FIELDS) - set(data))
    if unknown or missing:
        raise PlasmidError(f"{where}: sample fields differ from the format's (missing {missing or 'none'}, "
                           f"unknown {unknown or 'none'})")
    try:
        status = Status(data["status"])
    except ValueError:
        raise PlasmidError(f"{where}: unknown sample status {data['status']!r}") from None
    return Sample(**{**data, "status": status})


def encode_step(batch: RolloutBatch) -> str:
    """The file text of one step (header line, then one line per group)."""
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "rollout_id": batch.rollout_id,
              "groups": len(batch.groups), "metrics": batch.metrics}
    lines = [json.dumps(header, default=_plain)]
    for group in batch.groups:
        lines.append(json.dumps({"index": group.index, "samples": [encode_sample(s) for s in group.samples]},
                                default=_plain))
    return "\n".join(lines) + "\n"


def decode_step(text: str, where: str) -> RolloutBatch:
    """The :class:`RolloutBatch` of one step file's ``text``; damage names ``where`` and the line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise PlasmidError(f"{where}: empty; not a saved rollout step")
    try:
        header = json.loads(lines[0])
    except ValueError as exc:
        raise PlasmidError(f"{where}, line 1: not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise PlasmidError(f"{where}, line 1: not a {FORMAT_NAME} header")
    version = header.get("version")
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise PlasmidError(f"{where}: format version {version!r}, this plasmid reads versions 1 to {FORMAT_VERSION}")
    if header.get("groups") != len(lines) - 1:
        raise PlasmidError(f"{where}: the header counts {header.get('groups')} groups but the file holds "
                           f"{len(lines) - 1} (a damaged or truncated file)")
    groups = []
    for number, line in enumerate(lines[1:], 2):
        try:
            data = json.loads(line)
        except ValueError as exc:
            raise PlasmidError(f"{where}, line {number}: not JSON ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            raise PlasmidError(f"{where}, line {number}: not a group (an object with 'index' and 'samples')")
        groups.append(Group([decode_sample(s, f"{where}, line {number}") for s in data["samples"]],
                            int(data.get("index", 0))))
    metrics = {str(k): float(v) if v is not None else math.nan for k, v in dict(header.get("metrics", {})).items()}
    return RolloutBatch(rollout_id=int(header["rollout_id"]), groups=groups, metrics=metrics)


class RolloutStore:
    """The saved rollouts in directory ``root``: :meth:`save` one step, :meth:`load` one back."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def check_writable(self) -> None:
        """Create ``root`` if needed; a path that is a file is a one-line :class:`UsageError`."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"--save-rollouts {self.root}: is a file, not a directory")
        self.root.mkdir(parents=True, exist_ok=True)

    def save(self, batch: RolloutBatch) -> Path:
        """Write ``batch`` as its step file (atomically); returns the path."""
        path = step_path(self.root, batch.rollout_id)
        write_atomic(path, encode_step(batch))
        return path

    def steps(self) -> list[int]:
        """The rollout ids saved, in order."""
        if not self.root.is_dir():
            return []
        ids = []
        for path in self.root.glob("step_*.jsonl"):
            stem = path.stem.removeprefix("step_")
            if stem.isdigit():
                ids.append(int(stem))
        return sorted(ids)

    def check_readable(self, first: int, last: int) -> None:
        """Every step from ``first`` to ``last`` (inclusive) is saved; else a one-line error."""
        if not self.root.is_dir():
            raise UsageError(f"plasmid replay: {self.root}: no such directory of saved rollouts")
        saved = set(self.steps())
        missing = [i for i in range(first, last + 1) if i not in saved]
        if missing:
            have = f"steps {min(saved)}-{max(saved)}" if saved else "no step files"
            raise UsageError(f"plasmid replay: {self.root} lacks step {missing[0]} of the {last - first + 1} to "
                             f"replay ({len(missing)} missing; it has {have}); lower --num-rollouts")

    def load(self, rollout_id: int) -> RolloutBatch:
        """Step ``rollout_id``, read back; a missing step raises :class:`DataExhausted`."""
        path = step_path(self.root, rollout_id)
        if not path.is_file():
            raise DataExhausted(f"{self.root} holds no saved step {rollout_id}")
        batch = decode_step(path.read_text(encoding="utf-8"), str(path))
        if batch.rollout_id != rollout_id:
            raise PlasmidError(f"{path}: holds rollout {batch.rollout_id}, not {rollout_id}")
        return batch


class SaveRolloutsOptions(Options, group="saved rollouts"):
    save_rollouts: Path | None = option(None, "write every step's groups (tokens, loss masks, log-probs, rewards, "
                                        "metadata) to DIR, one file per step (see plasmid.app.rollout_store)",
                                        metavar="DIR", default_text="not saved")

    def check(self) -> None:
        if self.save_rollouts is not None and self.save_rollouts.exists() and not self.save_rollouts.is_dir():
            raise UsageError(f"--save-rollouts {self.save_rollouts}: is a file, not a directory")


def add_save_option(parser: OptionParser) -> None:
    """``--save-rollouts DIR`` (``plasmid train``, ``plasmid rollout``)."""
    parser.add_options(SaveRolloutsOptions)


class SavingDriver:
    """A rollout driver that saves each batch that ``inner`` returns to ``store``, then returns it."""

    def __init__(self, inner: RolloutDriver, store: RolloutStore) -> None:
        self.inner, self.store = inner, store

    async def run(self, ctx: RolloutView, rollout_id: int) -> RolloutBatch:
        batch = await self.inner.run(ctx, rollout_id)
        await asyncio.to_thread(self.store.save, batch)
        return batch

    async def evaluate(self, ctx: RolloutView, groups: list[Group], params: SamplingParams) -> dict[str, float]:
        return await self.inner.evaluate(ctx, groups, params)


def saving(driver: RolloutDriver, config: Config) -> RolloutDriver:
    """``driver``, saving its batches when ``--save-rollouts`` is given (the directory is made now)."""
    where = SaveRolloutsOptions.of(config).save_rollouts
    if where is None:
        return driver
    store = RolloutStore(where)
    store.check_writable()
    return SavingDriver(driver, store)
