"""``plasmid config show [--config FILE] [OPTIONS] [--json]``: the configuration ``plasmid train``
would run with, where each value came from, and the batch sizes it implies.

It goes through the same start-up as ``plasmid train`` (plugins, options, provider choices,
recipes, configure hooks, the run's checks) and writes nothing. Each option's source is one of:

- ``flag``: the command line (``@args.txt`` included);
- ``file``: a ``--config`` file;
- ``environment``: ``--plugins`` from ``PLASMID_PLUGINS``;
- ``resolved``: changed at start-up: a provider chosen for you, a recipe's default;
- ``derived``: computed by the kernel, not an option (``reward_weights``);
- ``default``: the declared default.

Native pass-through options (``--megatron-*``, ``--sglang-*``) at their default are counted, not
listed. ``--json`` prints ``{"option", "source", "batch", "plugin_lock", "run_dir"}``; its
``option`` equals the ``option`` of the ``config.json`` the run would write.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

from plasmid.app.helptext import NATIVE_SUFFIX
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid.families import FAMILIES
from plasmid.plugins import ENV_VAR, did_you_mean

ACTIONS = ("show",)

HELP = """usage: plasmid config show [--config FILE] [OPTIONS] [--json]

Print the configuration 'plasmid train' would run with (same options), where each value came
from (flag, file, environment, resolved at start-up, default), and the batch sizes it implies
(prompts x samples, optimizer steps, micro-batches, tokens per step). Writes nothing.

  --json     machine-readable: {"option", "source", "batch", "plugin_lock", "run_dir"}
  --help     this text; 'plasmid train --help' lists the options
"""


def config_command(argv: list[str]) -> int:
    """``plasmid config ACTION ...``; only ``show`` exists."""
    if not argv or argv[0] in ("-h", "--help"):
        print(HELP, end="")
        return 0
    action, rest = argv[0], argv[1:]
    if action not in ACTIONS:
        raise UsageError(f"plasmid config: unknown action {action!r}{did_you_mean(action, ACTIONS)} "
                         f"(plasmid config show [--config FILE] [OPTIONS] [--json])")
    if "-h" in rest or "--help" in rest:
        print(HELP, end="")
        return 0
    return show(rest)


def train_options() -> Callable[[OptionParser], None] | None:
    """The options ``plasmid train`` adds to the plugins' own (its ``add_options``), so that the
    configuration shown is the one it runs with."""
    from plasmid.app.summary import add_train_options

    return add_train_options


def _add_json(extra: Callable[[OptionParser], None] | None) -> Callable[[OptionParser], None]:
    def add(parser: OptionParser) -> None:
        if extra is not None:
            extra(parser)
        parser.getgroup("config show").addoption("--json", dest="show_json", action="store_true",
                                                 help="print JSON")
    return add


def show(argv: list[str]) -> int:
    from plasmid.app.start import option_parser, start

    extra = train_options()
    startup = start(argv, prog="plasmid config show", description="The resolved configuration.",
                    add_options=_add_json(extra))
    config = startup.config
    as_json = bool(config.option.show_json)
    delattr(config.option, "show_json")
    parser = option_parser()
    startup.manager.addoption(parser)
    _add_json(extra)(parser)
    report = describe(config, parser, argv)
    if as_json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(render(report, parser))
    return 0


def describe(config: Config, parser: OptionParser, argv: list[str],
             environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The report: ``option`` (as ``config.json`` has it), ``source`` of each (module docstring),
    ``batch`` (:func:`batch_sizes`), ``plugin_lock`` and ``run_dir``."""
    environ = dict(os.environ) if environ is None else environ
    saved = config.to_dict()
    given = parser.sources(argv)
    defaults = vars(parser.defaults())
    defaults.pop("show_json", None)
    sources: dict[str, str] = {}
    for name in saved["option"]:
        if name in given:
            sources[name] = given[name]
        elif name == "plugins" and environ.get(ENV_VAR) is not None:
            sources[name] = "environment"
        elif name not in defaults:
            sources[name] = "derived"
        elif _differs(getattr(config.option, name), defaults[name]):
            sources[name] = "resolved"
        else:
            sources[name] = "default"
    return {"option": saved["option"], "source": sources, "batch": batch_sizes(config),
            "plugin_lock": saved["plugin_lock"], "run_dir": saved["run_dir"]}


def _differs(value: Any, default: Any) -> bool:
    if isinstance(value, (list, tuple)) and (default is None or isinstance(default, (list, tuple))):
        return list(value) != list(default or [])
    return bool(value != default)


def batch_sizes(config: Config) -> dict[str, int | None]:
    """What one RL step processes, from the options (those a trainer declares are read when
    present):

    - ``samples_per_step``: ``prompts_per_step`` x ``n_samples_per_prompt``;
    - ``groups_started_per_step``: ``ceil(prompts_per_step x over_sampling)``;
    - ``samples_per_optimizer_step``: ``global_batch_size``, or every sample;
    - ``optimizer_steps_per_step``: ``ceil(samples_per_step / samples_per_optimizer_step)``;
    - ``micro_batches_per_optimizer_step`` (per trainer worker): ``ceil(samples_per_optimizer_step
      / trainer_workers / micro_batch_size)``; ``None`` without ``--micro-batch-size``;
    - ``max_response_tokens_per_step``: ``samples_per_step x max_new_tokens`` (an upper bound);
    - ``max_tokens_per_micro_batch``: the trainer's cap, when it has one.
    """
    get = config.getoption
    prompts, samples = int(get("prompts_per_step")), int(get("n_samples_per_prompt"))
    per_step = prompts * samples
    per_update = min(int(get("global_batch_size") or per_step), per_step)
    workers = int(get("trainer_workers", 1) or 1)
    micro = get("micro_batch_size")
    return {
        "prompts_per_step": prompts,
        "n_samples_per_prompt": samples,
        "samples_per_step": per_step,
        "groups_started_per_step": math.ceil(prompts * float(get("over_sampling", 1.0))),
        "samples_per_optimizer_step": per_update,
        "optimizer_steps_per_step": math.ceil(per_step / per_update),
        "trainer_workers": workers,
        "micro_batches_per_optimizer_step": math.ceil(per_update / workers / int(micro)) if micro else None,
        "max_response_tokens_per_step": per_step * int(get("max_new_tokens")),
        "max_tokens_per_micro_batch": get("max_tokens_per_micro_batch"),
    }


def render(report: dict[str, Any], parser: OptionParser) -> str:
    """The text form: option groups in ``--help`` order, ``name = value  (source)`` each; native
    options at their default counted per group; then the batch sizes."""
    family_options = {family.option for family in FAMILIES}
    option, source = report["option"], report["source"]
    lines = [f"run directory: {report['run_dir']}",
             "plugins: " + ", ".join(f"{e['name']} {e['version']}" for e in report["plugin_lock"]), ""]
    listed: set[str] = set()
    for group in parser._parser._action_groups:
        names = [a.dest for a in group._group_actions
                 if a.option_strings and a.dest in option and a.dest not in listed]
        if not names:
            continue
        listed.update(names)
        title = group.title or ""
        native = title.endswith(NATIVE_SUFFIX)
        shown = [n for n in names if not (native and source[n] == "default")]
        if native and len(shown) < len(names):
            lines.append(f"{title}: {len(names) - len(shown)} options at the framework's default (not listed)")
        if not shown:
            continue
        if not native:
            lines.append(f"{title}:")
        for name in shown:
            note = source[name]
            if note == "resolved" and name in family_options:
                note = "resolved: provider chosen at start-up"
            elif note == "resolved":
                note = "resolved: a recipe's default"
            lines.append(f"  {name} = {json.dumps(option[name], default=str)}  ({note})")
    rest = [n for n in option if n not in listed]
    if rest:
        lines.append("derived:")
        lines += [f"  {name} = {json.dumps(option[name], default=str)}  ({source[name]})" for name in rest]
    batch = report["batch"]
    lines += ["", "per RL step:",
              f"  {batch['prompts_per_step']} prompts x {batch['n_samples_per_prompt']} samples = "
              f"{batch['samples_per_step']} samples ({batch['groups_started_per_step']} groups started)",
              f"  {batch['optimizer_steps_per_step']} optimizer step(s) of {batch['samples_per_optimizer_step']} "
              f"samples" + (f", {batch['micro_batches_per_optimizer_step']} micro-batch(es) each on each of "
                            f"{batch['trainer_workers']} trainer worker(s)"
                            if batch["micro_batches_per_optimizer_step"] is not None else ""),
              f"  at most {batch['max_response_tokens_per_step']} response tokens"
              + (f"; at most {batch['max_tokens_per_micro_batch']} tokens per micro-batch"
                 if batch["max_tokens_per_micro_batch"] else "")]
    return "\n".join(lines)


__all__ = ["batch_sizes", "config_command", "describe", "render"]
