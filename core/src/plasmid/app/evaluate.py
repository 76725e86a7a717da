"""``plasmid eval``: evaluate a checkpoint or a model on one or more prompt sets; JSON results.

    plasmid eval --checkpoint DIR | --model DIR [--eval-data NAME=PATH ...] [--eval-n-samples K]
                 [--eval-temperature T --top-p P --top-k K --max-new-tokens N] [--output FILE] [train options]

``--checkpoint`` takes a checkpoint directory (``<run>/checkpoints/step_N``: its
``trainer/model`` is loaded) or a run directory (its newest complete checkpoint), and reads the
run's ``config.json`` first (:mod:`plasmid.app.runconfig`: the run's data source and eval split,
``--max-new-tokens``, chat template and rewards, unless a later ``--config`` or the command line
says otherwise); ``--model`` a model directory. A run's ``config.json`` is a valid ``--config``
(the ``train`` options ``eval`` lacks are ignored). Before each set one line on stderr says what
is evaluated (:func:`what_line`). The sets: each ``--eval-data NAME=PATH`` is read by the data source as its eval
prompts (``--eval-prompt-data PATH``; the ``jsonl`` source unless ``--datasource`` says
otherwise); without ``--eval-data``, the data source's own eval split, named after it.

Generation and scoring are the training run's evaluation (the rollout driver's ``evaluate``, with
the run's generate function and ``--reward``): each prompt is sampled ``--eval-n-samples`` times
with the evaluation sampling (``--eval-temperature``, greedy by default; ``--top-p``,
``--top-k``, ``--max-new-tokens``; sample ``i``'s seed is derived from ``--seed`` and its index,
as in training). Per set (see :func:`set_metrics`): ``accuracy`` (a sample is correct when its
first reward component is at least 1, as ``eval/accuracy`` in training), ``pass@k`` for
k = 1, 2, 4, ... up to and including K (the unbiased estimator, :func:`pass_at_k`),
``mean_length`` (response tokens), ``truncation_rate`` (samples that hit ``--max-new-tokens``),
``reward_mean``, with ``prompts`` and ``samples`` counts. The JSON document (:func:`evaluate`)
goes to stdout and, with ``--output FILE``, to that file (written atomically). Nothing else is
written: no run directory is created.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from plasmid.app.runconfig import data_text, with_run_config
from plasmid.atomic import write_atomic
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import RolloutOptions
from plasmid.options import Options, option
from plasmid.protocols import GenerateFn, RolloutView
from plasmid.types import Group, Sample, SamplingParams, Status


class EvalCommandOptions(Options, group="plasmid eval"):
    checkpoint: Path | None = option(None, "a checkpoint directory (step_N, its trainer/model is loaded) or a run "
                                     "directory (its newest checkpoint)", metavar="DIR", default_text="--model")
    eval_data: tuple[str, ...] = option((), "an eval set NAME=PATH (repeatable), read as the data source's eval "
                                        "prompts", metavar="NAME=PATH", default_text="the data source's eval split")
    eval_n_samples: int = option(1, "responses sampled per prompt (pass@k up to this k)", min=1)
    output: Path | None = option(None, "also write the JSON results to FILE", metavar="FILE", default_text="stdout")

    def check(self) -> None:
        names = [eval_set(text)[0] for text in self.eval_data]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise UsageError(f"--eval-data: the set name {repeated[0]!r} is given twice; name each set once")
        if self.output is not None and not self.output.parent.is_dir():
            raise UsageError(f"--output {self.output}: the directory {self.output.parent} does not exist")


def eval_set(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` as ``(name, path)``; the path must be an existing file (one-line error)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise UsageError(f"--eval-data {text!r}: expected NAME=PATH (e.g. gsm8k=data/gsm8k_test.jsonl)")
    if not Path(path).is_file():
        raise UsageError(f"--eval-data {text}: {path}: no such file")
    return name, Path(path)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` samples of which ``c`` are correct (Chen et al.
    2021): ``1 - C(n-c, k) / C(n, k)``, computed as a stable product; needs ``1 <= k <= n``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def ks_up_to(n: int) -> list[int]:
    """1, 2, 4, ... below ``n``, and ``n``."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def set_metrics(samples: Sequence[Sample], primary: str, n: int) -> dict[str, float]:
    """The metrics of one set (module docstring) from its scored ``samples``, grouped into
    prompts by ``group_index``; ``n`` is the samples asked per prompt (the k of pass@k stop
    there, or at the fewest a prompt got)."""
    if not samples:
        return {"prompts": 0.0, "samples": 0.0}
    prompts: dict[int, list[bool]] = {}
    for sample in samples:
        prompts.setdefault(sample.group_index, []).append(sample.reward_components.get(primary, 0.0) >= 1.0)
    metrics = {
        "prompts": float(len(prompts)),
        "samples": float(len(samples)),
        "accuracy": sum(ok for oks in prompts.values() for ok in oks) / len(samples),
        "reward_mean": sum(s.reward or 0.0 for s in samples) / len(samples),
        "mean_length": sum(s.response_length for s in samples) / len(samples),
        "truncation_rate": sum(s.status == Status.TRUNCATED for s in samples) / len(samples),
    }
    fewest = min(n, *(len(oks) for oks in prompts.values()))
    for k in ks_up_to(fewest):
        metrics[f"pass@{k}"] = sum(pass_at_k(len(oks), sum(oks), k) for oks in prompts.values()) / len(prompts)
    return metrics


class Recording:
    """A generate function that records every sample ``inner`` returns (to compute the set's
    metrics from the very samples the driver's evaluation scored)."""

    def __init__(self, inner: GenerateFn) -> None:
        self.inner = inner
        self.samples: list[Sample] = []

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample | list[Sample]:
        out = await self.inner(ctx, sample, params)
        self.samples.extend(out if isinstance(out, list) else [out])
        return out


def repeat_groups(groups: Sequence[Group], n: int) -> list[Group]:
    """Each group's first sample, ``n`` times: sample ``j`` of a prompt whose sample has index
    ``i`` gets index ``i * n + j`` (its seed), so ``n = 1`` samples as training's evaluation."""
    repeated = []
    for group in groups:
        if not group.samples:
            continue
        first = group.samples[0]
        repeated.append(Group([replace(first, index=first.index * n + j, metadata=dict(first.metadata))
                               for j in range(n)], group.index))
    return repeated


def command_line(argv: list[str]) -> list[str]:
    """``argv`` with what ``--checkpoint`` implies (:func:`plasmid.app.runconfig.with_run_config`:
    the run's ``config.json`` read first, ``--model`` the checkpoint's model) and, with
    ``--eval-data`` given, ``--datasource jsonl`` and ``--prompt-data`` (the first set) added
    unless given; refuses neither or both of ``--checkpoint`` and ``--model``."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--checkpoint", default=None)
    early.add_argument("--model", default=None)
    early.add_argument("--eval-data", action="append", default=[])
    early.add_argument("--datasource", default=None)
    early.add_argument("--prompt-data", default=None)
    known, _ = early.parse_known_args(argv)
    if (known.checkpoint is None) == (known.model is None):
        raise UsageError("plasmid eval: give exactly one of --checkpoint DIR and --model DIR")
    extra = []
    if known.eval_data and known.datasource is None:
        extra += ["--datasource", "jsonl"]
    if known.eval_data and known.prompt_data is None:  # the data source's start-up wants training prompts
        extra += ["--prompt-data", str(eval_set(known.eval_data[0])[1])]
    return [*with_run_config(argv), *extra]


def what_line(config: Config, name: str, path: Path | None, prompts: int, n: int, max_new_tokens: int) -> str:
    """The one line ``plasmid eval`` prints (stderr) before evaluating a set: its name, where its
    prompts come from (``path`` for an ``--eval-data`` set, else the data source's eval split), how
    many, the samples per prompt, the token budget and the model."""
    source = f"file {path}" if path is not None else f"{data_text(config.option, 'eval')}, eval split"
    return (f"plasmid eval: set {name!r}: {source}: {prompts} prompts x {n} sample(s), at most {max_new_tokens} "
            f"new tokens, model {config.option.model}")


def set_config(config: Config, path: Path) -> Config:
    """A copy of ``config`` whose data source reads ``path`` as its eval prompts (and as its
    training prompts when none is given)."""
    values = dict(vars(config.option))
    values["eval_prompt_data"] = path
    if values.get("prompt_data") is None:
        values["prompt_data"] = path
    return replace(config, option=argparse.Namespace(**values))


async def evaluate(argv: list[str]) -> dict[str, Any]:
    """Run ``plasmid eval`` (module docstring): print its JSON document (and write it to
    ``--output``) and return it: ``model``, ``n_samples``, ``sampling`` (the parameters used) and
    ``sets`` (name -> metrics)."""
    from plasmid.app.start import start
    from plasmid.session import build_inputs, build_rollout_context, instantiate

    startup = start(command_line(argv), prog="plasmid eval", own_options=(EvalCommandOptions,), run_configs=True,
                    description="Evaluate a checkpoint or model on prompt sets (JSON results).")
    config, registry = startup.config, startup.registry
    command = EvalCommandOptions.of(config)
    sets = [eval_set(text) for text in command.eval_data]
    if sets and not hasattr(config.option, "eval_prompt_data"):
        raise UsageError(f"--eval-data: the data source '{config.option.datasource}' reads no eval prompt file "
                         f"(--eval-prompt-data); use --datasource jsonl")
    build_inputs(startup)
    ctx = build_rollout_context(config, registry, prebuilt=startup.prebuilt)
    driver = instantiate(registry.get("rollout", config.option.rollout), config)
    rollout = RolloutOptions.of(config)
    params = replace(ctx.eval_sampling(), top_p=rollout.top_p, top_k=rollout.top_k)
    primary = ctx.rewards.components[0].name
    results: dict[str, Any] = {}
    try:
        named = ([(name, instantiate(registry.get("datasource", config.option.datasource),
                                     set_config(config, path)).eval_groups()) for name, path in sets]
                 or [(str(config.option.datasource), ctx.data_source.eval_groups())])
        for name, groups in named:
            if not groups:
                raise UsageError(f"eval set {name!r} has no prompts" + ("" if sets else
                                 " (the data source has no eval split; give --eval-data NAME=PATH)"))
            print(what_line(config, name, dict(sets).get(name), len(groups), command.eval_n_samples,
                            params.max_new_tokens), file=sys.stderr, flush=True)
            recording = Recording(ctx.generate)
            await driver.evaluate(replace(ctx, generate=recording), repeat_groups(groups, command.eval_n_samples),
                                  params)
            results[name] = set_metrics(recording.samples, primary, command.eval_n_samples)
    finally:
        for engine in ctx.engines:
            await engine.shutdown()
    document = {"model": str(config.option.model), "n_samples": command.eval_n_samples,
                "sampling": {k: v for k, v in asdict(params).items() if k != "stop_token_ids"}, "sets": results}
    text = json.dumps(document, indent=2)
    if command.output is not None:
        write_atomic(command.output, text + "\n")
    sys.stdout.write(text + "\n")
    return document


def eval_command(argv: list[str]) -> int:
    """``plasmid eval``: print the JSON results (and write ``--output``); exit status 0."""
    if "-h" in argv or "--help" in argv:  # every option, the train options included (argparse exits 0)
        from plasmid.app.start import start

        start(["--help"], prog="plasmid eval", own_options=(EvalCommandOptions,), run_configs=True,
              description="Evaluate a checkpoint (--checkpoint DIR) or a model (--model DIR) on prompt sets; "
                          "JSON results (see plasmid.app.evaluate).")
        return 0
    asyncio.run(evaluate(argv))
    return 0
