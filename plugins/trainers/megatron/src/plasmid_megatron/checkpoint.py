"""Checkpoint directories of the megatron trainer.

Layout of ``<path>/``::

    model/                      a complete Hugging Face model directory: safetensors in HF names
                                (gathered over all ranks), --model's config.json and generation
                                config, its tokenizer files. Loads with AutoModelForCausalLM.
    trainer_state/rank_NNNNN.pt one file per global rank (torch.save; our own, weights_only=False):
                                the megatron optimizer's state dict (with the distributed
                                optimizer also this rank's shard of the parameter state: main
                                weights and Adam moments, megatron's "dp_reshardable" form),
                                the LR scheduler, RNG states (torch, CUDA, Python, numpy,
                                megatron's tracker), the trainer's counters and the layout.

Resuming needs the same parallel layout (checked); the Hugging Face ``model/`` has none and loads
into any layout (weights only). The directory is written as ``<path>.tmp`` and renamed into place by
global rank 0 after every rank has written, so a reader never sees a half-written checkpoint.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

MODEL_SUBDIR = "model"
STATE_SUBDIR = "trainer_state"
#: Files of a model directory copied into the checkpoint's ``model/`` besides the weights.
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json", "added_tokens.json",
               "vocab.*", "merges.txt", "chat_template*", "spiece.model", "sentencepiece*.model")


def state_file(path: str | Path, rank: int) -> Path:
    return Path(path) / STATE_SUBDIR / f"rank_{rank:05d}.pt"


def rng_state() -> dict[str, Any]:
    """Every random generator this process uses (megatron's tracker included)."""
    from megatron.core import tensor_parallel

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
             "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def write(path: str | Path, *, hf_tensors: Iterable[tuple[str, torch.Tensor]], model_dir: Path,
          state: dict[str, Any]) -> Path:
    """Write checkpoint ``path`` (a collective: every rank calls it with its own ``state``;
    ``hf_tensors`` is the collective weight export, iterated on every rank, saved by rank 0)."""
    from safetensors.torch import save_file

    target = Path(path)
    staging = target.with_name(target.name + ".tmp")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        if staging.exists():
            shutil.rmtree(staging)
        (staging / MODEL_SUBDIR).mkdir(parents=True)
        (staging / STATE_SUBDIR).mkdir()
    _barrier()
    tensors = dict(hf_tensors)          # every rank takes part in the export's collectives
    if rank == 0:
        save_file(tensors, str(staging / MODEL_SUBDIR / "model.safetensors"), metadata={"format": "pt"})
        copy_model_files(model_dir, staging / MODEL_SUBDIR)
    torch.save(state, state_file(staging, rank))
    _barrier()
    if rank == 0:
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    _barrier()
    return target


def copy_model_files(source: Path, target: Path) -> list[str]:
    """Copy ``config.json``, the generation config and the tokenizer files of ``source`` to ``target``."""
    copied = []
    for pattern in MODEL_FILES:
        for file in sorted(source.glob(pattern)):
            if file.is_file() and not (target / file.name).exists():
                shutil.copy2(file, target / file.name)
                copied.append(file.name)
    return copied


def read_state(path: str | Path) -> dict[str, Any]:
    rank = dist.get_rank() if dist.is_initialized() else 0
    file = state_file(path, rank)
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: {path} is not a complete megatron-trainer checkpoint for "
                                f"global rank {rank} (was it written with a different number of ranks?)")
    return torch.load(file, map_location="cpu", weights_only=False)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
