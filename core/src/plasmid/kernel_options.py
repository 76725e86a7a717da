"""The kernel's own options: what to load, which provider of each family, and the loop's
schedule, sampling, rewards, evaluation and checkpoints. A kernel plugin.

Options of a family's providers (training, losses, engines, ...) are declared with that family's
library or plugin, not here.
"""

from __future__ import annotations

import math
import os
from datetime import datetime
from pathlib import Path
from typing import Literal

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.families import FAMILIES
from plasmid.options import Options, option


class GeneralOptions(Options, group="general"):
    plugins: str | None = option(None, "plugins to load: a,b | no:a | ./file.py | pkg.module (default: every "
                                 "installed plugin; env PLASMID_PLUGINS)", default_text="")
    debug: bool = option(False, "show tracebacks of plugin and provider errors")
    seed: int = option(0, "seed of every random generator", min=0)
    model: str | None = option(None, "local Hugging Face model directory", default_text="the datasource's recipe, "
                               "e.g. the quickstart's tiny model")
    run_dir: str | None = option(None, "run directory", default_text="runs/<timestamp>")
    resume: bool = option(False, "continue from the newest complete checkpoint in --run-dir (none: start the "
                                "run from step 0)")
    resume_allow_changes: bool = option(False, "let --resume continue with options or plugins that differ "
                                        "from the run's (listed when refused)")


class RolloutOptions(Options, group="rollout", description="what each step samples and how it is scored"):
    num_rollouts: int = option(500, "RL steps to run", min=1)
    prompts_per_step: int = option(32, "prompt groups trained on per step", min=1)
    n_samples_per_prompt: int = option(8, "responses sampled per prompt", min=1)
    over_sampling: float = option(1.0, "groups started per step, as a multiple of --prompts-per-step (filters "
                                  "may drop some)", min=1)
    temperature: float = option(1.0, "sampling temperature", min=0)
    top_p: float = option(1.0, "nucleus sampling mass", gt=0, max=1)
    top_k: int = option(0, "sample among the k most likely tokens; 0 disables", min=0)
    max_new_tokens: int = option(64, "response length limit (tokens)", min=1,
                                 default_text="64; the quickstart recipe: the task's answer length")
    stop_token_ids: tuple[str, ...] = option((), "token ids that also end a response, besides the model's "
                                             "end-of-sequence ids (the tokenizer's and generation_config.json's): "
                                             "IDS as 1,2,3 (repeatable)", metavar="IDS", default_text="none")
    reward_key: str | None = option(None, "pick this field of dict-valued rewards")
    reward_timeout: float = option(60.0, "seconds before a reward call fails", gt=0)
    reward_errors: Literal["zero", "fail"] = option("zero", "on a failing reward: score the sample 0 and go on, "
                                                    "or stop the run")
    return_routed_experts: bool = option(False, "ask the rollout engine for each token's mixture-of-experts "
                                         "routing (Sample.metadata['routed_experts'], for a trainer's routing "
                                         "replay): torchgen and sglang report it (and refuse a dense model); "
                                         "other engines leave it out", default_text="off; on with megatron's "
                                         "--routing-replay r3")

    @property
    def samples_per_step(self) -> int:
        """Samples trained on per step: ``--prompts-per-step`` x ``--n-samples-per-prompt``."""
        return self.prompts_per_step * self.n_samples_per_prompt

    @property
    def extra_stop_ids(self) -> tuple[int, ...]:
        """The ``--stop-token-ids`` as ints, in order, each once (checked by :meth:`check`)."""
        return tuple(dict.fromkeys(stop_ids(self.stop_token_ids)))

    def check(self) -> None:
        stop_ids(self.stop_token_ids)


class PromptOptions(Options, group="prompts", description="which prompts fit the model's context"):
    max_prompt_length: int | None = option(
        None, "the longest prompt (tokens) a data source keeps; at most the model's context minus --max-new-tokens",
        min=1, default_text="the model's context minus --max-new-tokens; none when the model names no context")
    overlong_prompts: Literal["drop", "error"] = option(
        "drop", "a prompt longer than --max-prompt-length at start-up: drop it (counted on stderr and in the metric "
        "data/dropped_overlong), or stop with an error naming its row")


class ScheduleOptions(Options, group="schedule",
                      description="how rollout, training and weight sync are placed and overlapped"):
    engines: int = option(1, "rollout engines", min=1)
    trainer_workers: int = option(1, "data-parallel trainer processes", min=1)
    placement: Literal["colocate", "disaggregate"] = option(
        "colocate", "colocate: trainer and engines share devices (engines release memory while training); "
        "disaggregate: separate pools")
    schedule: Literal["sync", "async"] = option(
        "sync", "async: the rollout of step k+1 overlaps training of step k (disaggregate only)")
    update_weights_interval: int = option(1, "sync weights every N steps", min=1)
    update_weight_buffer_size: int = option(512 * 1024**2, "bytes per weight-sync bucket", min=1)
    max_staleness: int | None = option(None, "drop samples generated more than N weight versions ago (async)",
                                       min=0, default_text="keep all")
    partial_rollout: bool = option(False, "groups aborted at the end of a step keep their tokens and resume in "
                                   "a later step")
    mask_offpolicy_in_partial_rollout: bool = option(False, "zero the loss mask on tokens generated by older "
                                                     "weights in resumed samples")

    def check(self) -> None:
        if self.schedule == "async" and self.placement == "colocate":
            raise UsageError("--schedule async overlaps rollout and training, which needs --placement disaggregate")


class EvalOptions(Options, group="evaluation"):
    eval_interval: int = option(10, "evaluate every N steps (0: never)", min=0)
    eval_temperature: float = option(0.0, "sampling temperature of evaluation; 0 is greedy", min=0)
    stop_at_eval_acc: float | None = option(None, "stop once eval accuracy reaches this", default_text="never")


class CheckpointOptions(Options, group="checkpoints"):
    save_interval: int = option(50, "checkpoint every N steps, and at the end (0: only at the end)", min=0)
    keep_checkpoints: int = option(2, "complete checkpoints kept on disk", min=1)


class FaultOptions(Options, group="faults", description="when the loop stops a run that cannot learn"):
    max_bad_steps: int = option(3, "stop (with a checkpoint) after N steps in a row that the trainer refused "
                                "(non-finite loss or gradient, ...)", min=1)
    max_empty_steps: int = option(5, "stop (with a checkpoint) after N steps in a row in which the filters "
                                  "(or --max-staleness) dropped every group", min=1)
    observer_errors: Literal["warn", "fail"] = option(
        "warn", "an observer hook (plasmid_metrics, plasmid_step_end, ...) that raises: warn once and switch that "
        "plugin's observers off for the rest of the run, or stop the run (with a checkpoint of the step)")


class ProfileOptions(Options, group="profiling", description="where each step's time goes"):
    """``--profile`` adds the per-step time breakdown to the metrics (see :mod:`plasmid.loop`);
    ``--profile-step N`` has a plugin that can (plasmid-torchtrain) write a PyTorch profiler
    trace of step ``N`` to ``<run dir>/profile/``."""

    profile: bool = option(False, "add each step's time breakdown to the metrics: time/step_seconds = rollout + "
                           "train + sync_wall + eval + checkpoint + overhead seconds, time/reward_seconds, and the "
                           "trainer's train/forward_backward_seconds and train/optimizer_seconds (device synchronised)")
    profile_step: int | None = option(None, "write a PyTorch profiler trace (chrome trace JSON) of step N to "
                                      "<run dir>/profile/ (plasmid-torchtrain writes it)", min=0,
                                      default_text="no trace")


#: The kernel's own option classes, in ``--help`` order.
KERNEL_OPTIONS: tuple[type[Options], ...] = (GeneralOptions, RolloutOptions, PromptOptions, ScheduleOptions,
                                             EvalOptions, CheckpointOptions, FaultOptions, ProfileOptions)


def stop_ids(values: tuple[str, ...]) -> list[int]:
    """The ids of ``--stop-token-ids`` values (each ``ID`` or ``ID,ID,...``); anything but a
    non-negative integer is a one-line :class:`UsageError` (ids past the vocabulary are checked
    against the model, :func:`plasmid.stop_tokens.check_stop_token_ids`)."""
    ids = []
    for value in values:
        for part in str(value).split(","):
            text = part.strip()
            if not (text.isascii() and text.isdigit()):
                raise UsageError(f"--stop-token-ids {value}: {text!r} is not a token id (expected non-negative "
                                 f"integers, as 1,2,3)")
            ids.append(int(text))
    return ids


def reward_spec(text: str) -> tuple[str, float]:
    """Parse ``NAME`` or ``NAME:WEIGHT`` (``--reward format:0.1``); the weight is a finite
    number (negative weights penalise); NaN and infinities are a :class:`UsageError`."""
    name, _, weight = text.partition(":")
    if not name:
        raise UsageError(f"--reward {text!r}: expected NAME or NAME:WEIGHT")
    try:
        value = float(weight) if weight else 1.0
    except ValueError:
        raise UsageError(f"--reward {text!r}: the weight after ':' must be a number") from None
    if not math.isfinite(value):
        raise UsageError(f"--reward {text!r}: the weight after ':' must be a finite number, not {weight}")
    return name, value


def reward_weights(config: Config) -> list[tuple[str, float]]:
    """``(name, weight)`` of every ``--reward`` component, in order."""
    return [reward_spec(text) for text in (config.option.reward or [])]


def add_choice_options(parser: OptionParser) -> None:
    """One flag per provider family (:data:`plasmid.families.FAMILIES`)."""
    group = parser.getgroup("providers", "which plugin provides each part of the loop")
    for family in FAMILIES:
        if family.cardinality == "one":
            group.addoption(family.flag, dest=family.option, default=None, help=family.help)
        else:
            metavar = "NAME[:WEIGHT]" if family.cardinality == "weighted" else "NAME"
            group.addoption(family.flag, dest=family.option, action="append",
                            default=None if family.cardinality == "weighted" else [], metavar=metavar,
                            help=family.help)


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(GeneralOptions)
    add_choice_options(parser)
    for cls in KERNEL_OPTIONS[1:]:
        parser.add_options(cls)


@hookimpl
def plasmid_configure(config: Config) -> None:
    """``--profile-step`` names a step the run makes (steps are numbered from 0)."""
    step, steps = ProfileOptions.of(config).profile_step, RolloutOptions.of(config).num_rollouts
    if step is not None and step >= steps:
        raise UsageError(f"--profile-step {step}: the run makes steps 0-{steps - 1} (--num-rollouts {steps}); "
                         f"choose one of them")


def default_run_dir(cwd: str | None = None) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(cwd or os.getcwd()) / "runs" / stamp
