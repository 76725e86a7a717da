"""The recipe for running without ``--model``: a tiny model whose tokenizer covers the task's text.

Applied by the plugin's ``plasmid_defaults`` when ``reasoning-gym`` is the chosen data source,
before options are checked. It checks the reasoning-gym version and the mixture (names, weights,
configs, system prompt), so a bad option fails before anything is written, and fills only what
the user left unset:

- ``--model``: ``<run dir>/model``. The recipe only names it; :func:`prepare_tiny_model` (the
  source's ``prepare``, which ``plasmid train`` calls once the run directory is checked) builds it
  unless that directory exists (a resumed run keeps its model): a char tokenizer
  (:func:`plasmid_torch.tiny.char_tokenizer`) over printable ASCII, tab and newline plus every
  other character of the system prompt and of the questions and answers of both splits, and a
  tiny causal LM (:func:`plasmid_torch.tiny.build_tiny_model`, hidden 64, 2 layers, 4 heads, with
  ``--seed`` and ``--rg-arch``) with enough positions for the longest prompt plus
  ``--max-new-tokens``, rounded up to a multiple of 64. It runs on a CPU and downloads nothing;
  it is not expected to learn reasoning.
- ``--lr``: 5e-4 for that tiny model (the quickstart's).
- ``--max-new-tokens``: 32, room for ``<answer>...</answer>`` around a short answer.
"""

from __future__ import annotations

from pathlib import Path

from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid_reasoning_gym import gym
from plasmid_reasoning_gym.mixture import Split, parse_mixture
from plasmid_reasoning_gym.options import ReasoningGymOptions
from plasmid_reasoning_gym.prompts import prompt_text, system_prompt

TINY_LR = 5e-4
TINY_MAX_NEW_TOKENS = 32
TINY_MODEL_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "tie_word_embeddings": True}
#: Characters every tiny model's tokenizer has, whatever the entries hold.
BASE_ALPHABET = "\t\n" + "".join(chr(code) for code in range(32, 127))


def splits(config: Config) -> tuple[Split, Split]:
    """The ``train`` and ``eval`` splits the options describe (checked: one-line UsageErrors)."""
    options, general = ReasoningGymOptions.of(config), GeneralOptions.of(config)
    mixture = parse_mixture(options.rg_dataset, options.rg_config)
    seed = general.seed if options.rg_seed is None else options.rg_seed
    return (Split(mixture, split="train", size=options.rg_size, seed=seed),
            Split(mixture, split="eval", size=options.rg_eval_size, seed=seed))


def apply_recipe(config: Config) -> None:
    """Check the reasoning-gym options; fill ``model``, ``lr`` and ``max_new_tokens`` if unset."""
    gym.check_version()
    splits(config)
    system_prompt(ReasoningGymOptions.of(config).rg_system_prompt)
    if GeneralOptions.of(config).model is None:
        config.set_default("model", str(tiny_model_dir(config)))
        config.set_default("lr", TINY_LR)
        config.set_default("max_new_tokens", TINY_MAX_NEW_TOKENS)


def tiny_model_dir(config: Config) -> Path:
    """Where the recipe's tiny model lives: ``<run dir>/model``."""
    return Path(config.run_dir) / "model"


def tiny_alphabet_and_positions(config: Config) -> tuple[str, int]:
    """The tiny tokenizer's alphabet (see the module docstring) and the model's positions."""
    system = system_prompt(ReasoningGymOptions.of(config).rg_system_prompt)
    chars = set(BASE_ALPHABET) | set(system or "")
    longest = 0
    for split in splits(config):
        for k in range(split.size):
            entry = split.entry(k)
            text = prompt_text(system, str(entry["question"]))
            chars.update(text, str(entry.get("answer") or ""))
            longest = max(longest, len(text))
    alphabet = BASE_ALPHABET + "".join(sorted(chars - set(BASE_ALPHABET)))
    needed = 1 + longest + RolloutOptions.of(config).max_new_tokens + 1  # <bos>, prompt, response, <eos>
    return alphabet, -(-needed // 64) * 64


def prepare_tiny_model(config: Config) -> None:
    """Build the tiny model that the recipe named as ``--model``, unless it is there already (or
    the user gave ``--model``). Writes only ``<run dir>/model``."""
    model_dir = tiny_model_dir(config)
    if config.is_given("model") or GeneralOptions.of(config).model != str(model_dir) or model_dir.exists():
        return
    from plasmid_torch.tiny import build_tiny_model

    alphabet, positions = tiny_alphabet_and_positions(config)
    build_tiny_model(model_dir, alphabet=alphabet, seed=GeneralOptions.of(config).seed,
                     arch=ReasoningGymOptions.of(config).rg_arch, max_positions=positions, **TINY_MODEL_SHAPE)
