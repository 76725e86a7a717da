"""``plasmid parity --engine E --trainer T --model DIR``: do an engine and a trainer give the same
log-probs to the same tokens, and where do they part when they do not?

The contract:

- The engine, the trainer and its loss are built from the registry exactly as ``plasmid train``
  builds them (every plugin's options, ``--config`` files, the configure hooks), in this process;
  a plugin that serves or trains elsewhere (SGLang, vLLM servers; megatron) is reached through its
  usual provider interface.
- The sequences: ``--sequences FILE`` (JSON lines of ``{"token_ids": [...], "prompt_length": N}``),
  or the prompts (``--prompt``, repeatable; :data:`plasmid_parity.sequences.DEFAULT_PROMPTS`)
  rendered with the model's tokenizer and its chat template, each with one response sampled by the
  engine at ``--temperature`` (``--max-new-tokens`` tokens, seeded from ``--seed``).
- Each sequence's response is scored by the engine (``response_logprobs``) and by the trainer
  (``logprobs``) at ``--temperature``; the report gives ``|engine - trainer|``: its maximum, its
  mean and both by response position (:class:`plasmid_parity.report.LogprobDiff`).
- Beyond ``--bound`` (default :data:`BOUNDS`, by ``--precision``), the layer search
  (:mod:`plasmid_parity.layers`) names the first layer and sublayer whose output differs, where both
  sides hold a Hugging Face module in this process (torchgen, torchtrain); elsewhere the report
  says why it cannot run. A mixture-of-experts model also gets the share of routing decisions that
  differ and whether routing replay covers them (:func:`routing_lines`).
- Exit status 0 when the maximum is within the bound, 1 when not; bad input (a missing model
  directory, an unknown engine, a bad sequences line) is one line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plasmid.app.start import start
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.options import Options, option
from plasmid.providers import instantiate
from plasmid.registry import Registry
from plasmid_parity.layers import LayerSearch, hf_module, replay
from plasmid_parity.report import LogprobDiff
from plasmid_parity.sequences import DEFAULT_PROMPTS, ScoredSequence, encode_prompts, read_sequences, sample_responses
from plasmid_torch.scoring import model_vocab

#: The default ``--bound`` by ``--precision``: float32 log-probs of the same weights agree to ~1e-6,
#: so 1e-4 leaves room for a different kernel or batch shape and none for a wrong weight; bfloat16
#: rounds each activation to 8 bits of mantissa (3.9e-3 relative), and log-probs of matching bf16
#: implementations differ by up to a few 1e-2.
BOUNDS = {"fp32": 1e-4, "bf16": 5e-2, "bf16-autocast": 5e-2}

#: What ``--parity-perturb-engine`` adds to every element of the named engine tensor (test support).
PERTURBATION = 1e-2


class ParityOptions(Options, group="plasmid parity",
                    description="plasmid parity: engine and trainer log-probs of the same tokens"):
    sequences: Path | None = option(None, 'JSON lines of {"token_ids": [...], "prompt_length": N} to score',
                                    metavar="FILE", default_text="the prompts, with a response the engine samples")
    prompt: tuple[str, ...] = option((), "a prompt to render with the model's chat template and sample a response "
                                     "to (repeatable)", metavar="TEXT", default_text=" ".join(DEFAULT_PROMPTS))
    bound: float | None = option(None, "the largest |engine - trainer| log-prob difference that passes", gt=0,
                                 default_text="1e-4 at --precision fp32, 5e-2 in bfloat16")
    parity_perturb_engine: str | None = option(
        None, f"TEST SUPPORT: add {PERTURBATION:g} to every element of this tensor (a Hugging Face weight name) in "
        "the engine only, to check that a planted divergence is found", metavar="NAME")


def command_line(argv: list[str]) -> list[str]:
    """``argv`` unchanged, once it is known to name ``--model`` (refused without: the quickstart's
    recipe model is no model to check)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--model", default=None)
    early.add_argument("-h", "--help", action="store_true")
    known, _ = early.parse_known_args(argv)
    if known.model is None and not known.help:
        raise UsageError("plasmid parity: give --model DIR (a Hugging Face model directory)")
    return argv


def parity_command(argv: list[str]) -> int:
    """The command (entry point ``parity`` of group ``plasmid.commands``; the module docstring is its
    contract). Returns 0 within the bound, 1 beyond it; refusals raise :class:`UsageError`."""
    startup = start(command_line(argv), prog="plasmid parity", own_options=(ParityOptions,),
                    description="Score the same token sequences through --engine and --trainer (built as plasmid "
                                "train builds them, from --model) and report the log-prob difference (max, mean, "
                                "by response position); beyond --bound, the first layer and sublayer where they "
                                "diverge (engines and trainers that hold a Hugging Face module in this process: "
                                "torchgen, torchtrain) and, for a MoE model, the routing decisions that differ. "
                                "Without --sequences, each --prompt gets one response sampled by the engine at "
                                "--temperature, --max-new-tokens long, seeded by --seed. Exit 0 within the bound, "
                                "1 beyond it, 2 for bad input.")
    return asyncio.run(run_parity(startup.config, startup.registry))


def bound_of(config: Config, options: ParityOptions) -> float:
    """``--bound``, else :data:`BOUNDS`'s entry for ``--precision`` (fp32 when the run has none)."""
    if options.bound is not None:
        return options.bound
    return BOUNDS.get(str(getattr(config.option, "precision", "fp32")), BOUNDS["fp32"])


async def run_parity(config: Config, registry: Registry, out: Any = None) -> int:
    """Build, score, compare and report (module docstring); the exit status."""
    out = out or sys.stdout
    option, options = config.option, ParityOptions.of(config)
    general, rollout = GeneralOptions.of(config), RolloutOptions.of(config)
    model_dir = str(general.model)
    bound = bound_of(config, options)
    engine_provider, trainer_provider = registry.get("engine", option.engine), registry.get("trainer", option.trainer)
    sequences = read_sequences(options.sequences, model_vocab(model_dir)) if options.sequences else None
    prompts = None if sequences is not None else encode_prompts(model_dir, options.prompt or DEFAULT_PROMPTS)
    engine = instantiate(engine_provider, config)
    try:
        loss = instantiate(registry.get("loss", option.loss), config)
        trainer = instantiate(trainer_provider, config, loss)
        if options.parity_perturb_engine:
            await perturb(engine, trainer, options.parity_perturb_engine)
        if sequences is None:
            sequences = await sample_responses(engine, prompts or [], rollout.max_new_tokens, rollout.temperature,
                                               general.seed)
        where = (f"{len(sequences)} sequences from {options.sequences}" if options.sequences else
                 f"{len(sequences)} prompts with a response sampled by the engine (up to {rollout.max_new_tokens} "
                 f"tokens)")
        print(f"plasmid parity: engine {engine_provider.describe()} vs trainer {trainer_provider.describe()}, model "
              f"{model_dir}: {where}, temperature {rollout.temperature:g}", file=out, flush=True)
        engine_scores = await engine_logprobs(engine, sequences, rollout.temperature)
        trainer_scores = await trainer.logprobs([s.sample(i) for i, s in enumerate(sequences)], rollout.temperature)
        try:
            diff = LogprobDiff.of(engine_scores, trainer_scores)
        except ValueError as exc:
            raise UsageError(f"plasmid parity: {exc}") from None
        for line in diff.lines(bound):
            print(line, file=out)
        for line in search_lines(config, engine, trainer, sequences, bound, diff.within(bound)):
            print(line, file=out)
        return 0 if diff.within(bound) else 1
    finally:
        await engine.shutdown()


async def engine_logprobs(engine: Any, sequences: Sequence[ScoredSequence], temperature: float) -> list[list[float]]:
    """The engine's ``response_logprobs`` of every sequence (concurrently: an engine batches them);
    a refusal (a token outside the vocabulary, past the context) is one line naming the sequence."""
    async def one(sequence: ScoredSequence) -> list[float]:
        try:
            return list(await engine.response_logprobs(sequence.token_ids, sequence.prompt_length, temperature))
        except ValueError as exc:
            raise UsageError(f"plasmid parity: sequence {sequence.origin}: the engine refused it: {exc}") from None
    return list(await asyncio.gather(*(one(sequence) for sequence in sequences)))


async def perturb(engine: Any, trainer: Any, name: str) -> None:
    """TEST SUPPORT (``--parity-perturb-engine NAME``): load the trainer's tensor ``name`` plus
    :data:`PERTURBATION` into the engine through ``update_weights`` (its version unchanged), so the
    engine alone differs there. An unknown name is a :class:`UsageError` listing a few known ones."""
    names = []
    for bucket in trainer.export_weights(1 << 30):
        for tensor_name, tensor in bucket:
            if tensor_name == name:
                await engine.update_weights([(name, tensor.detach().clone() + PERTURBATION)], engine.weight_version)
                return
            names.append(tensor_name)
    raise UsageError(f"--parity-perturb-engine {name}: the trainer exports no tensor of that name (it has "
                     f"{', '.join(names[:4])}, ... {len(names)} in all)")


def search_lines(config: Config, engine: Any, trainer: Any, sequences: Sequence[ScoredSequence], bound: float,
                 within: bool) -> list[str]:
    """The layer search's report (beyond the bound) and the MoE routing comparison (a MoE model),
    or why they cannot run for this engine and trainer."""
    from plasmid_torch.routers import moe_routers

    option = config.option
    engine_model, engine_why = hf_module(engine, "engine", option.engine)
    trainer_model, trainer_why = hf_module(trainer, "trainer", option.trainer)
    if engine_model is None or trainer_model is None:
        why = engine_why or trainer_why
        lines = [] if within else [f"layer search unavailable: {why}"]
        if trainer_model is not None and moe_routers(trainer_model):
            lines.append(f"MoE routing comparison unavailable: {why}")
        return lines
    moe = bool(moe_routers(trainer_model))
    if within and not moe:
        return []
    search = LayerSearch()
    try:
        for sequence in sequences:
            search.add(replay(engine, engine_model, sequence.token_ids),
                       replay(trainer, trainer_model, sequence.token_ids))
    except Exception as exc:  # noqa: BLE001 - the log-prob report stands; say why the search could not run
        return [f"layer search failed: replaying the sequences raised {type(exc).__name__}: {exc}"]
    lines = [] if within else search.lines(bound)
    if moe:
        lines += routing_lines(config, search, sequences)
    return lines


def routing_lines(config: Config, search: LayerSearch, sequences: Sequence[ScoredSequence]) -> list[str]:
    """How many (token, MoE layer) routing decisions differ between the two sides, and whether the
    trainer's routing replay covers them: ``--routing-replay r3`` (megatron) routes the trainer's
    passes as the engine did, for samples that carry the engine's routing."""
    share = search.differing / search.decisions if search.decisions else 0.0
    lines = [f"MoE routing: {search.differing} of {search.decisions} (token, layer) decisions differ ({share:.2%})"]
    replay_mode = getattr(config.option, "routing_replay", None)
    trainer = config.option.trainer
    carried = all(sequence.routing is not None for sequence in sequences)
    if not search.differing:
        cover = "nothing to cover: every decision agrees"
    elif replay_mode is None:
        cover = (f"not covered: trainer '{trainer}' has no routing replay (the megatron trainer's --routing-replay r3 "
                 f"routes as the engine did)")
    elif replay_mode == "r3" and carried:
        cover = ("covered: --routing-replay r3 and every sequence carries the engine's routing, so the trainer's "
                 "log-probs above used the engine's experts")
    elif replay_mode == "r3":
        cover = ("not covered here: --routing-replay r3 needs the engine's routing on each sequence (sampled with "
                 "--return-routed-experts); these sequences carry none")
    else:
        cover = f"not covered: --routing-replay {replay_mode} does not replay the engine's routing (r3 does)"
    return [*lines, f"routing replay: {cover}"]


__all__ = ["BOUNDS", "ParityOptions", "parity_command", "run_parity"]
