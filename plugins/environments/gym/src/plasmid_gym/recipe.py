"""The recipe of ``--datasource gym``: ``--generate gym --reward gym`` and, without ``--model``, a tiny
model whose char tokenizer covers printable ASCII (what TextArena's text games write).

Applied by the plugin's ``plasmid_defaults`` when ``gym`` is the chosen data source; fills only
what the user left unset: the generate function and reward, ``--model`` (``<run dir>/model``, built
by :func:`prepare_tiny_model`, the source's ``prepare``, unless it exists: hidden 64, 2 layers,
4096 positions, the char tokenizer's own chat template), ``--lr`` 5e-4 and ``--max-new-tokens`` 16.
It runs on a CPU and downloads nothing; it is not expected to learn.
"""

from __future__ import annotations

from pathlib import Path

from plasmid.config import Config
from plasmid.kernel_options import GeneralOptions

ALPHABET = "\t\n" + "".join(chr(code) for code in range(32, 127))
TINY_MODEL_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "tie_word_embeddings": True,
                    "max_positions": 4096}


def apply_recipe(config: Config) -> None:
    config.set_default("generate", "gym")
    if not config.is_given("reward"):
        config.option.reward = ["gym"]
        config.option.reward_weights = [("gym", 1.0)]
    if GeneralOptions.of(config).model is None:
        config.set_default("model", str(tiny_model_dir(config)))
        config.set_default("lr", 5e-4)
        config.set_default("max_new_tokens", 16)


def tiny_model_dir(config: Config) -> Path:
    return Path(config.run_dir) / "model"


def prepare_tiny_model(config: Config) -> None:
    """Build the model the recipe named unless it is there (or ``--model`` was given)."""
    model_dir = tiny_model_dir(config)
    if config.is_given("model") or GeneralOptions.of(config).model != str(model_dir) or model_dir.exists():
        return
    from plasmid_torch.tiny import build_tiny_model

    build_tiny_model(model_dir, alphabet=ALPHABET, seed=GeneralOptions.of(config).seed, **TINY_MODEL_SHAPE)
