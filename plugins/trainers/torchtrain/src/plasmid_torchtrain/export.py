"""``plasmid export CHECKPOINT OUT [--adapters-only] [--force] [--push-to-hub REPO [--private]]``.

Writes a publishable Hugging Face model directory from a run's checkpoint.

Where it lives, and why here: a command of group ``plasmid.commands`` provided by plasmid-torchtrain
(``export = "plasmid_torchtrain.export:export_command"``), not a command of ``plasmid.app`` with a
trainer hook. The checkpoint layout it reads is this trainer's (:mod:`plasmid_torchtrain.checkpoint`:
``trainer/model/`` a complete HF directory holding the merged weights, ``trainer/adapter/`` a LoRA
policy's adapters in peft's format), so what a checkpoint means is decided by the package that
writes it; a trainer hook would be a new hookspec in the kernel, which has no lines left for one.
The megatron trainer's checkpoints are read too, as a small step: their ``trainer/model/`` is the
same complete HF directory (streamed by :mod:`plasmid_megatron.hf_export`), recognised by its
``dist/`` beside it, without importing megatron; it has no LoRA, so ``--adapters-only`` is refused.

The contract:

- CHECKPOINT is a checkpoint directory (``<run>/checkpoints/step_N``, complete: has ``meta.json``)
  or a run directory (its newest complete checkpoint).
- OUT receives: the weights as safetensors with ``config.json`` (a LoRA run's weights merged into
  the base, as the checkpoint holds them), or with ``--adapters-only`` the adapters alone
  (``adapter_model.safetensors``, ``adapter_config.json``; load with ``PeftModel.from_pretrained``
  on the run's ``--model``); the tokenizer files with the chat template; ``generation_config.json``
  (the model's, with the run's sampling: :func:`generation_config`); ``README.md``, a model card
  (:func:`model_card`: the options the run changed, the plugins it used, the final metrics); and
  ``plasmid_run.json``, the run's ``config.json`` and plugin lock whole.
- Everything is checked before anything is written. A refusal (:class:`UsageError`: missing
  checkpoint, a run with none, a checkpoint whose trainer format is not understood, OUT a file or a
  non-empty directory without ``--force``, ``--force`` on a directory that is not a model
  directory, ``--adapters-only`` without adapters, a bad ``--push-to-hub`` repository id or the
  hub switched off) is one line naming what and where, exit 2, and nothing written.
- The directory is written into a staging directory beside OUT (``.NAME.partial-*``) and renamed
  to OUT at the end, so an interrupted export never leaves OUT half written (a failing one removes
  its staging directory; a killed one leaves only it, beside OUT). ``--force`` moves the old OUT
  aside only once the new one is complete.
- ``--push-to-hub REPO`` then uploads OUT with ``huggingface_hub``: ``HfApi().create_repo(REPO,
  repo_type="model", private=--private, exist_ok=True)`` and ``HfApi().upload_folder(repo_id=REPO,
  folder_path=OUT, repo_type="model", commit_message=...)``, with the token of ``hf auth login`` or
  ``HF_TOKEN``. A failing upload is one line (exit 1) saying that OUT is complete and how to retry.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plasmid.errors import UsageError
from plasmid_torch.directories import replace_dir, sibling

#: What ``meta.json`` of a complete checkpoint is called (:mod:`plasmid.checkpoint`).
META_FILE = "meta.json"
#: The files of the run directory the card reads (:mod:`plasmid.app.rundir`).
RUN_CONFIG, RUN_LOCK, RUN_METRICS = "config.json", "plugins.lock.json", "metrics.jsonl"
#: The file of OUT that holds the run's configuration and lock whole.
RUN_RECORD = "plasmid_run.json"
#: Files of a directory that ``--force`` may replace (one of them): a model or adapter directory.
MODEL_DIR_MARKERS = ("config.json", "adapter_config.json")
#: Files of the checkpoint's model directory that the export writes itself instead of copying.
REWRITTEN = frozenset({"generation_config.json", "README.md"})
#: Options of the run that the card leaves out: where the run wrote, not what it trained.
PLACE_OPTIONS = frozenset({"run_dir", "resume", "resume_allow_changes", "save_rollouts", "debug", "verbose"})
#: Metrics shown first in the card (besides every ``eval/`` one), when the run logged them.
HEADLINE_METRICS = ("rollout/reward_mean", "rollout/accuracy", "rollout/response_length_mean", "train/loss",
                    "train/entropy", "train/approx_kl", "train/kl")


@dataclass
class Checkpoint:
    """A resolved CHECKPOINT.

    :ivar path: the checkpoint directory (``<run>/checkpoints/step_N``).
    :ivar run_dir: the run directory above it.
    :ivar trainer: the trainer whose layout it has (``torchtrain`` or ``megatron``).
    :ivar model_dir: its complete HF model directory (``trainer/model``).
    :ivar adapter_dir: its LoRA adapters in peft's format, or ``None``.
    :ivar meta: its ``meta.json``.
    :ivar config: the run's ``config.json`` (``{}`` when the run has none).
    :ivar lock: the run's plugin lock (``plugins.lock.json``, else the checkpoint's).
    """

    path: Path
    run_dir: Path
    trainer: str
    model_dir: Path
    adapter_dir: Path | None
    meta: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    lock: list[dict[str, Any]] = field(default_factory=list)

    @property
    def step(self) -> int:
        return int(self.meta.get("rollout_id", -1))

    @property
    def option(self) -> dict[str, Any]:
        """The run's options (``config.json``'s ``option``), ``{}`` when unknown."""
        option = self.config.get("option")
        return option if isinstance(option, dict) else {}


def export_command(argv: list[str]) -> int:
    """The command (entry point ``export`` of group ``plasmid.commands``): ``argv`` are the arguments
    after its name. Returns 0 (exported, and pushed when asked), 1 when the push failed; refusals
    raise :class:`UsageError` (one line, exit 2, nothing written)."""
    from plasmid.config import ArgumentParser

    parser = ArgumentParser(prog="plasmid export",
                            description="Write a publishable Hugging Face model directory (weights, tokenizer, "
                                        "generation config, model card) from a run's checkpoint.")
    parser.add_argument("checkpoint", metavar="CHECKPOINT", type=Path,
                        help="a checkpoint directory (runs/X/checkpoints/step_N) or a run directory (its newest "
                             "checkpoint)")
    parser.add_argument("out", metavar="OUT", type=Path, help="the directory to write (absent or empty)")
    parser.add_argument("--adapters-only", action="store_true",
                        help="a LoRA run: write the peft adapters instead of the weights merged into the base")
    parser.add_argument("--force", action="store_true", help="replace OUT when it is a model directory")
    parser.add_argument("--push-to-hub", metavar="REPO", default=None,
                        help="then upload OUT to the Hugging Face Hub repository REPO (user/name), created if "
                             "missing; the token of 'hf auth login' or HF_TOKEN")
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create REPO private")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args(argv)
    if args.private and args.push_to_hub is None:
        raise UsageError("--private applies to --push-to-hub REPO, which was not given")
    if args.push_to_hub is not None:
        check_hub(args.push_to_hub)
    source = resolve(args.checkpoint)
    if args.adapters_only and source.adapter_dir is None:
        raise UsageError(f"--adapters-only: checkpoint {source.path} holds no LoRA adapters ({source.trainer} "
                         f"checkpoint trained without --lora-rank); export it without --adapters-only")
    check_out(args.out, args.force)
    written = export(source, args.out, adapters_only=args.adapters_only)
    kind = "LoRA adapters" if args.adapters_only else ("weights (LoRA merged)" if source.adapter_dir else "weights")
    print(f"wrote {written}: {kind} of {source.path} (step {source.step}, {source.trainer}), tokenizer, "
          f"generation config, model card")
    if args.push_to_hub is None:
        return 0
    try:
        url = push(written, args.push_to_hub, private=args.private,
                   message=f"plasmid export of {source.run_dir.name} step {source.step}")
    except Exception as exc:  # noqa: BLE001 - a network or hub failure; the export itself is complete
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"plasmid: error: pushing {written} to {args.push_to_hub} failed: {first}; {written} is complete: "
              f"retry with plasmid export --push-to-hub or 'hf upload {args.push_to_hub} {written}'", file=sys.stderr)
        return 1
    print(f"pushed {written} to {url}")
    return 0


# ------------------------------------------------------------------------------------------ checks
def resolve(path: Path) -> Checkpoint:
    """The checkpoint ``path`` names (module docstring), with its run's configuration, lock and
    layout; :class:`UsageError` for a missing or incomplete checkpoint and one whose trainer
    format is not understood. Reads only."""
    if not path.exists():
        raise UsageError(f"CHECKPOINT {path}: no such directory")
    if not path.is_dir():
        raise UsageError(f"CHECKPOINT {path} is a file; give a checkpoint directory (runs/X/checkpoints/step_N) or a "
                         f"run directory")
    from plasmid.app.runconfig import is_run_config

    if (path / "checkpoints").is_dir() or is_run_config(path / RUN_CONFIG):
        from plasmid.checkpoint import Checkpoints

        latest = Checkpoints(path).latest()
        if latest is None:
            raise UsageError(f"CHECKPOINT {path}: the run directory holds no complete checkpoint (nothing under "
                             f"{path / 'checkpoints'} with a {META_FILE})")
        run_dir, path = path, latest
    else:
        run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    meta = _read_json(path / META_FILE)
    if not isinstance(meta, dict):
        raise UsageError(f"CHECKPOINT {path} is not a complete plasmid checkpoint (no readable {META_FILE}); give "
                         f"runs/X/checkpoints/step_N or the run directory")
    config = _read_json(run_dir / RUN_CONFIG)
    config = config if isinstance(config, dict) else {}
    lock = _read_json(run_dir / RUN_LOCK)
    lock = lock if isinstance(lock, list) else list(meta.get("plugin_lock") or [])
    option = config.get("option") if isinstance(config.get("option"), dict) else {}
    named = option.get("trainer") if isinstance(option, dict) else None
    trainer_dir, model_dir = path / "trainer", path / "trainer" / "model"
    has_model = (model_dir / "config.json").is_file() and any(model_dir.glob("*.safetensors"))
    if has_model and (trainer_dir / "trainer_state.pt").is_file():
        trainer = "torchtrain"
    elif has_model and (trainer_dir / "dist").is_dir():
        trainer = "megatron"
    else:
        by = f"trainer {named!r} (the run's config.json)" if named else "its trainer"
        raise UsageError(f"CHECKPOINT {path}: the format of {by} is not understood: plasmid export reads a "
                         f"torchtrain or megatron checkpoint (trainer/model/ with config.json and *.safetensors, "
                         f"beside trainer_state.pt or dist/), and {trainer_dir} is not one")
    adapter_dir = trainer_dir / "adapter"
    has_adapters = all((adapter_dir / name).is_file() for name in ("adapter_model.safetensors", "adapter_config.json"))
    return Checkpoint(path=path, run_dir=run_dir, trainer=trainer, model_dir=model_dir,
                      adapter_dir=adapter_dir if has_adapters else None, meta=meta, config=config, lock=lock)


def check_out(out: Path, force: bool) -> None:
    """Refuse (:class:`UsageError`) an OUT that is a file, a non-empty directory without ``force``,
    and with ``force`` a non-empty directory that is not a model directory (none of
    :data:`MODEL_DIR_MARKERS`: it could be any folder, and ``--force`` deletes it)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UsageError(f"OUT {out} exists and is not a directory; choose another OUT")
    if not any(out.iterdir()):
        return
    if not force:
        raise UsageError(f"OUT {out} exists and is not empty; --force replaces it, or choose another OUT")
    if not any((out / name).is_file() for name in MODEL_DIR_MARKERS):
        raise UsageError(f"OUT {out} is not a model directory (no {' or '.join(MODEL_DIR_MARKERS)}); --force "
                         f"replaces only a model directory: choose another OUT")


def check_hub(repo: str) -> None:
    """Refuse (:class:`UsageError`) a ``--push-to-hub`` that cannot happen: huggingface_hub missing,
    an invalid repository id, or the hub switched off (``HF_HUB_OFFLINE``)."""
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]  # public, not in __all__
    except ImportError:
        raise UsageError("--push-to-hub needs huggingface_hub, which is not installed: pip install "
                         "huggingface_hub") from None
    try:
        validate_repo_id(repo)
    except ValueError as exc:
        raise UsageError(f"--push-to-hub {repo}: not a repository id (user/name): {exc}") from None
    if "/" not in repo:
        raise UsageError(f"--push-to-hub {repo}: give the repository as user/name or organization/name")
    if constants.HF_HUB_OFFLINE:
        raise UsageError(f"--push-to-hub {repo}: HF_HUB_OFFLINE is set, so the hub cannot be reached; unset it "
                         f"to push")


# ------------------------------------------------------------------------------------------ writing
def export(source: Checkpoint, out: Path, *, adapters_only: bool = False) -> Path:
    """Write the export of ``source`` (module docstring) into a staging directory beside ``out``
    and rename it to ``out`` (an existing ``out`` is replaced only then); returns ``out``, absolute.
    On any error the staging directory is removed and ``out`` is as it was."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = sibling(out, "partial")
    staging.mkdir()
    try:
        write_into(source, staging, adapters_only=adapters_only, name=out.name)
        replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def write_into(source: Checkpoint, target: Path, *, adapters_only: bool, name: str) -> None:
    """The files of the export of ``source``, into the existing directory ``target``; ``name`` is
    what the model card calls the directory (OUT's name). Files are copied with fresh permissions."""
    from plasmid_torchtrain.checkpoint import copy_tokenizer_files

    if adapters_only:
        assert source.adapter_dir is not None
        for file_name in ("adapter_model.safetensors", "adapter_config.json"):
            shutil.copyfile(source.adapter_dir / file_name, target / file_name)
        copy_tokenizer_files(source.model_dir, target)
    else:
        for file in sorted(source.model_dir.iterdir()):
            if file.is_file() and file.name not in REWRITTEN:
                shutil.copyfile(file, target / file.name)
    generation = generation_config(source)
    generation.save_pretrained(str(target))
    record = {"checkpoint": str(source.path), "step": source.step, "trainer": source.trainer,
              "config": source.config, "plugin_lock": source.lock}
    (target / RUN_RECORD).write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    (target / "README.md").write_text(model_card(source, adapters_only=adapters_only, name=name),
                                      encoding="utf-8")


def sampling_settings(option: dict[str, Any]) -> dict[str, Any]:
    """The generation settings of the run's rollouts (``--temperature``, ``--top-p``, ``--top-k``,
    ``--max-new-tokens``), as ``GenerationConfig`` fields: a temperature of 0 is greedy
    (``do_sample`` false, no temperature); ``top_k`` 0 and ``top_p`` 1 are off in both. Options the
    run's configuration does not have are left out."""
    settings: dict[str, Any] = {}
    temperature = option.get("temperature")
    if isinstance(temperature, (int, float)):
        settings["do_sample"] = temperature > 0
        if temperature > 0:
            settings["temperature"] = float(temperature)
            if isinstance(option.get("top_p"), (int, float)):
                settings["top_p"] = float(option["top_p"])
            if isinstance(option.get("top_k"), int):
                settings["top_k"] = int(option["top_k"])
    if isinstance(option.get("max_new_tokens"), int):
        settings["max_new_tokens"] = int(option["max_new_tokens"])
    return settings


def generation_config(source: Checkpoint) -> Any:
    """The model's ``generation_config.json`` (else one from its ``config.json``) with the run's
    sampling (:func:`sampling_settings`) and its ``--stop-token-ids`` added to ``eos_token_id``;
    validated by transformers."""
    from transformers import GenerationConfig

    file = source.model_dir / "generation_config.json"
    if file.is_file():
        generation = GenerationConfig.from_pretrained(str(source.model_dir))
    else:
        from transformers import AutoConfig

        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(source.model_dir)))
    for key, value in sampling_settings(source.option).items():
        setattr(generation, key, value)
    stops = source.option.get("stop_token_ids")
    if isinstance(stops, list) and stops:
        eos = generation.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        generation.eos_token_id = eos + [int(token) for token in stops if int(token) not in eos]
    generation._from_model_config = False   # edited: transformers must not rebuild it from config.json
    generation.validate()
    return generation


# ------------------------------------------------------------------------------------------ the card
def changed_options(source: Checkpoint) -> list[tuple[str, Any, str]]:
    """``(option, value, plugin)`` of every option the run set to other than its default, as its
    lock records them (:func:`plasmid.app.runlock.used_lock`); for a lock written before it
    recorded them, against the defaults the installed plugins declare. Sorted; without
    :data:`PLACE_OPTIONS`."""
    from plasmid.app.runlock import records_use, used_options

    option = source.option
    if records_use(source.lock):
        changed = {name: str(entry.get("name")) for name, entry in used_options(source.lock).items()}
    else:
        from plasmid.app.introspect import load_tolerantly
        from plasmid.app.runlock import declared_options

        owners, defaults = declared_options(load_tolerantly(None)[0])
        changed = {name: owners[name][0] for name, value in option.items()
                   if name in defaults and json.loads(json.dumps(value, default=str)) != defaults[name]}
    return [(name, option.get(name), plugin) for name, plugin in sorted(changed.items())
            if name not in PLACE_OPTIONS and name in option]


def final_metrics(source: Checkpoint) -> dict[str, float]:
    """The last value of every metric of the run's ``metrics.jsonl`` logged at or before the
    checkpoint's step (an eval metric logged at an earlier step included); ``{}`` without the file."""
    file = source.run_dir / RUN_METRICS
    values: dict[str, float] = {}
    if not file.is_file():
        return values
    for line in file.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue   # a line cut short by a killed run
        if not isinstance(row, dict) or int(row.get("step", -1)) > source.step:
            continue
        values.update({key: value for key, value in row.items() if key != "step" and isinstance(value, (int, float))})
    return values


def model_card(source: Checkpoint, *, adapters_only: bool, name: str) -> str:
    """The ``README.md`` of the export: Hub metadata (``library_name``, ``base_model`` when
    ``--model`` is a Hub id, tags), what was trained and how to load it, the sampling written to
    ``generation_config.json``, the final metrics (:func:`final_metrics`), the options the run
    changed (:func:`changed_options`) and the plugins it used (from its lock)."""
    from plasmid.app.runlock import is_used

    option = source.option
    base = option.get("model")
    hub_base = isinstance(base, str) and base.count("/") == 1 and not Path(base).exists() and not base.startswith(".")
    lora = source.adapter_dir is not None
    loss = option.get("loss")
    front = ["---", f"library_name: {'peft' if adapters_only else 'transformers'}"]
    if hub_base:
        front.append(f"base_model: {base}")
    front += ["pipeline_tag: text-generation", "tags:", "- plasmid", "- reinforcement-learning"]
    front += [f"- {tag}" for tag in (loss, "lora" if lora else None) if isinstance(tag, str)]
    front.append("---")
    what = ("LoRA adapters (peft)" if adapters_only else "the LoRA adapters merged into the base weights" if lora
            else "the trained weights")
    lines = [*front, "", f"# {name}", "",
             f"Trained with plasmid ({source.trainer} trainer"
             + (f", {loss} loss" if loss else "") + f"): step {source.step} of run `{source.run_dir.name}`"
             + (f", from `{base}`" if base else "") + f". This directory holds {what}.", ""]
    lines += ["## Usage", "", "```python"]
    if adapters_only:
        lines += ["from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f"base = AutoModelForCausalLM.from_pretrained({json.dumps(base or 'BASE_MODEL')})",
                  f"model = PeftModel.from_pretrained(base, {json.dumps(name)})"]
    else:
        lines += ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f"model = AutoModelForCausalLM.from_pretrained({json.dumps(name)})"]
    lines += [f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(name)})", "```", ""]
    settings = sampling_settings(option)
    if settings:
        shown = ", ".join(f"`{key}={value}`" for key, value in settings.items())
        lines += ["## Sampling", "", f"`generation_config.json` samples as the run's rollouts did: {shown}.", ""]
    metrics = final_metrics(source)
    if metrics:
        first = [key for key in sorted(metrics) if key.startswith("eval/")]
        first += [key for key in HEADLINE_METRICS if key in metrics]
        lines += [f"## Final metrics (step {source.step})", "", "| metric | value |", "|---|---|"]
        lines += [f"| `{key}` | {_number(metrics[key])} |" for key in first]
        rest = [key for key in sorted(metrics) if key not in first]
        if rest:
            lines += ["", "<details><summary>every metric</summary>", "", "| metric | value |", "|---|---|"]
            lines += [f"| `{key}` | {_number(metrics[key])} |" for key in rest]
            lines += ["", "</details>"]
        lines.append("")
    changed = changed_options(source)
    lines += ["## Configuration", "", "The options of `plasmid train` that the run set to other than their "
              f"defaults (all of them, with the plugin lock, are in `{RUN_RECORD}`):", ""]
    if changed:
        lines += ["| option | value | plugin |", "|---|---|---|"]
        lines += [f"| `--{key.replace('_', '-')}` | {_cell(value)} | {plugin} |" for key, value, plugin in changed]
    else:
        lines.append("none" if source.config else "unknown: the run directory has no config.json")
    lines += ["", "## Plugins", "", "The plugins the run used (its plugin lock):", "",
              "| plugin | distribution | version | provides |", "|---|---|---|---|"]
    for entry in source.lock:
        if not is_used(entry):
            continue
        provides = "; ".join(f"{family}: {', '.join(names)}" for family, names in sorted(
            (entry.get("providers") or {}).items()))
        lines.append(f"| {entry.get('name')} | {entry.get('distribution')} | {entry.get('version') or '-'} | "
                     f"{provides or '-'} |")
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return "`" + str(text).replace("|", "\\|").replace("`", "'").replace("\n", " ") + "`"


# ------------------------------------------------------------------------------------------ the hub
def push(folder: Path, repo: str, *, private: bool, message: str) -> str:
    """Upload ``folder`` to model repository ``repo`` on the Hugging Face Hub (created when missing,
    ``private`` then); returns the URL of the commit (or the repository)."""
    from huggingface_hub import HfApi

    api = HfApi()
    created = api.create_repo(repo_id=repo, repo_type="model", private=private, exist_ok=True)
    commit = api.upload_folder(repo_id=repo, folder_path=str(folder), repo_type="model", commit_message=message)
    return str(getattr(commit, "commit_url", None) or commit or created)


# ------------------------------------------------------------------------------------------ helpers
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
