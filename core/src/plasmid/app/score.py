"""``plasmid score``: score responses from stdin with the rewards a run would use.

::

    echo 'The answer is \\boxed{4}' | plasmid score --reward math --label 4
    plasmid score --reward math --reward format:0.1 < responses.jsonl

Each non-blank input line is a JSON object ``{"response": ..., "label": ..., "prompt": ...,
"metadata": {...}}`` (only ``response`` is required; other keys are ignored) or, when it does not
start with ``{``, a plain-text response. ``--label`` is the label of lines that have none.
Rewards are built and combined exactly as in training (:class:`plasmid.rewards.RewardSet`:
weights, ``--reward-key``, ``--reward-timeout``, ``--reward-errors``), from the plugins that
``--plugins`` selects, with every plugin option available (``--math-think-tag`` ...).
``--group-size N`` scores N consecutive lines as one group (for group rewards, such as judges).
``--checkpoint DIR`` (a run directory or one of its checkpoints) reads the run's ``config.json``
first, so its rewards, weights and reward options score (:mod:`plasmid.app.runconfig`); a run's
``config.json`` is also a valid ``--config`` (the ``train`` options ``score`` lacks are ignored).

Output: one JSON object per scored line, in input order, as soon as its group is scored::

    {"line": 3, "reward": 1.1, "components": {"math": 1.0, "format": 1.0}}

plus ``"errors": ["math: ValueError: ..."]`` when a reward failed on it (it then scored 0 for
that reward): it raised, timed out (``"math: timed out"``), or returned a value that is not a
finite float32 or overflows float32 once weighted. At the end one line on stderr says how many
lines were scored with which rewards (:func:`what_line`), and the reward failures if any. When
every reward failed on every line, a warning says so on stderr.
A line that cannot be read stops the command with exit status 2 and a message naming the line;
so does a failing reward under ``--reward-errors fail``. Samples carry no token ids (there is
no tokenizer here): rewards that need ``tokens`` cannot be checked this way.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from plasmid.app.runconfig import with_run_config
from plasmid.app.start import start
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.options import Options, option
from plasmid.rewards import RewardSet
from plasmid.session import build_reward_set
from plasmid.types import Sample, Status


class ScoreOptions(Options, group="score", description="plasmid score: responses on stdin, one per line"):
    checkpoint: Path | None = option(None, "score with the rewards of this run (a run directory or one of its "
                                     "checkpoints): its config.json is read first", metavar="DIR")
    label: str | None = option(None, "label of the lines that carry none")
    group_size: int = option(1, "score N consecutive lines as one group", min=1)


def read_sample(line: str, number: int, default_label: Any) -> Sample:
    """The sample of input line ``number`` (1-based); :class:`UsageError` naming the line if unreadable."""
    text = line.rstrip("\n")
    if not text.lstrip().startswith("{"):
        return Sample(response=text, label=default_label, index=number, status=Status.COMPLETED)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"stdin line {number}: starts with '{{' but is not valid JSON ({exc.msg} at column "
                         f"{exc.colno}); write a plain-text response that starts with '{{' as "
                         f'{{"response": "..."}}') from None
    if not isinstance(record, dict) or not isinstance(record.get("response"), str):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise UsageError(f'stdin line {number}: a JSON line needs a "response" string (got {keys})')
    metadata = record.get("metadata", {})
    if not isinstance(metadata, dict):
        raise UsageError(f'stdin line {number}: "metadata" must be a JSON object, got {type(metadata).__name__}')
    return Sample(prompt=record.get("prompt", ""), response=record["response"],
                  label=record.get("label", default_label), metadata=dict(metadata), index=number,
                  status=Status.COMPLETED)


def result_line(sample: Sample) -> str:
    result: dict[str, Any] = {"line": sample.index, "reward": sample.reward, "components": sample.reward_components}
    if sample.metadata.get("reward_errors"):
        result["errors"] = sample.metadata["reward_errors"]
    return json.dumps(result)


async def score_lines(rewards: RewardSet, lines: Iterable[str], default_label: Any, group_size: int,
                      out: TextIO) -> int:
    """Score ``lines`` in groups of ``group_size``, writing one result line each; how many scored."""
    group: list[Sample] = []
    scored = 0

    async def flush() -> None:
        nonlocal scored
        for sample in group:
            sample.group_index = group[0].index
        await rewards.score_group(group)
        for sample in group:
            out.write(result_line(sample) + "\n")
        out.flush()
        scored += len(group)
        group.clear()

    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        group.append(read_sample(line, number, default_label))
        if len(group) == group_size:
            await flush()
    if group:
        await flush()
    return scored


def score_command(argv: list[str], stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    startup = start(with_run_config(argv, model=False), prog="plasmid score", own_options=(ScoreOptions,),
                    description="Score responses from stdin with the chosen rewards.", rewards_only=True,
                    run_configs=True)
    options = ScoreOptions.of(startup.config)
    if not startup.config.option.reward_weights:
        raise UsageError("no reward is loaded: choose one with --reward NAME ('plasmid plugins' lists them)")
    rewards = build_reward_set(startup.config, startup.registry)
    try:
        scored = asyncio.run(score_lines(rewards, stdin or sys.stdin, options.label, options.group_size,
                                         stdout or sys.stdout))
        failures = rewards.pop_metrics()
    finally:
        rewards.close()
    summary = ", ".join(f"{key.removeprefix('reward/failed/')} x{int(count)}" for key, count in failures.items())
    print(what_line(startup.config, scored, options) + (f"; reward failures: {summary}" if failures else ""),
          file=sys.stderr)
    return 0


def what_line(config: Config, scored: int, options: ScoreOptions) -> str:
    """The line ``plasmid score`` ends with (stderr): how many lines from stdin were scored, in
    groups of how many, with which rewards and weights (``math:1.0``), and whose run's they are."""
    rewards = ", ".join(f"{name}:{weight:g}" for name, weight in config.option.reward_weights)
    where = f" (the rewards of {options.checkpoint})" if options.checkpoint is not None else ""
    groups = f" in groups of {options.group_size}" if options.group_size > 1 else ""
    return f"plasmid score: {scored} lines from stdin scored{groups} with {rewards}{where}"
