"""Checkpoint directories of the torch trainer.

Layout of ``<path>/``::

    model/               a complete Hugging Face model directory (safetensors weights, config,
                         generation config, and the tokenizer files of --model): loads with
                         AutoModelForCausalLM / AutoTokenizer.from_pretrained
    trainer_state.pt     optimizer and LR-scheduler state (the critic's too), RNG states
                         (torch, random, numpy), and the trainer's counters (torch.save; our
                         own file, loaded with weights_only=False)
    critic.safetensors   the critic's weights (backbone and value head), when the loss has one

The directory is written under ``<path>.tmp`` and renamed into place, so a reader never sees a
half-written checkpoint.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

MODEL_SUBDIR = "model"
STATE_FILE = "trainer_state.pt"
#: Files of a model directory that belong to its tokenizer (copied into checkpoints).
TOKENIZER_PATTERNS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
                      "chat_template*", "spiece.model", "sentencepiece*.model")


def rng_state() -> dict[str, Any]:
    """The process's torch, Python ``random`` and numpy generator states (and CUDA's, where torch
    sees a GPU)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def copy_tokenizer_files(source: Path, target: Path) -> list[str]:
    """Copy the tokenizer files of model directory ``source`` into ``target``; their names."""
    copied = []
    for pattern in TOKENIZER_PATTERNS:
        for file in sorted(source.glob(pattern)):
            if file.is_file() and not (target / file.name).exists():
                shutil.copy2(file, target / file.name)
                copied.append(file.name)
    return copied


def write(path: str | Path, *, model: Any, tokenizer_dir: Path, state: dict[str, Any], critic: Any = None) -> Path:
    """Write ``model`` (HF format, plus tokenizer files from ``tokenizer_dir``), ``state`` and
    the ``critic`` (when given) to checkpoint directory ``path``, atomically; replaces an
    existing checkpoint there."""
    target = Path(path)
    staging = target.with_name(target.name + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    model.save_pretrained(staging / MODEL_SUBDIR)
    copy_tokenizer_files(tokenizer_dir, staging / MODEL_SUBDIR)
    torch.save(state, staging / STATE_FILE)
    if critic is not None:
        from plasmid_torchtrain.critic import save_critic

        save_critic(critic, staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's ``model/*.safetensors`` files, by HF name."""
    from safetensors.torch import load_file

    files = sorted((Path(path) / MODEL_SUBDIR).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{Path(path) / MODEL_SUBDIR}: no *.safetensors weights; is {path} a "
                                f"checkpoint written by the torchtrain trainer?")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


def read_state(path: str | Path) -> dict[str, Any]:
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: {path} is not a complete torchtrain checkpoint")
    return torch.load(file, map_location="cpu", weights_only=False)
