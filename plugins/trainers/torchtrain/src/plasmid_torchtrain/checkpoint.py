"""Checkpoint directories of the torch trainer.

Layout of ``<path>/``::

    model/               a complete Hugging Face model directory (safetensors weights, config,
                         generation config, and the tokenizer files of --model): loads with
                         AutoModelForCausalLM / AutoTokenizer.from_pretrained
    trainer_state.pt     optimizer and LR-scheduler state (the critic's too), RNG states
                         (torch, random, numpy), and the trainer's counters (torch.save; our
                         own file, loaded with weights_only=False)
    critic.safetensors   the critic's weights (backbone and value head), when the loss has one
    adapter/             (a LoRA policy, --lora-rank) the adapters in peft's format; model/ then
                         holds the merged weights and trainer_state.pt the adapters' AdamW state

    dcp/                 (written by an FSDP2-sharded trainer, :func:`write_sharded`) the policy's
                         weights and AdamW state in ``torch.distributed.checkpoint`` format, each
                         rank its shards; any number of ranks (one included) reads them back,
                         resharded (:func:`read_sharded`). trainer_state.pt then has no
                         "optimizer" entry; model/ still holds the whole weights in HF format.

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
DCP_SUBDIR = "dcp"
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


def write_sharded(path: str | Path, *, model: Any, optimizer: Any, tokenizer_dir: Path, state: dict[str, Any],
                  rank: int, critic: Any = None) -> Path:
    """What :func:`write` writes, by every rank of an FSDP2-sharded ``model`` together (a
    collective call): the weights and AdamW state through ``torch.distributed.checkpoint`` (each
    rank its shards, under ``dcp/``), the whole weights gathered to rank 0's CPU memory and saved
    there in HF format, with ``state`` (rank 0's) and the ``critic``; atomically, as :func:`write`."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    target = Path(path)
    staging = target.with_name(target.name + ".tmp")
    if rank == 0:
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
    dist.barrier()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(staging / DCP_SUBDIR))
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        model.save_pretrained(staging / MODEL_SUBDIR, state_dict=whole)
        copy_tokenizer_files(tokenizer_dir, staging / MODEL_SUBDIR)
        torch.save(state, staging / STATE_FILE)
        if critic is not None:
            from plasmid_torchtrain.critic import save_critic

            save_critic(critic, staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    dist.barrier()
    return target


def is_sharded(path: str | Path) -> bool:
    """Whether checkpoint ``path`` was written by a sharded trainer (it has ``dcp/``)."""
    return (Path(path) / DCP_SUBDIR).is_dir()


def read_sharded(path: str | Path, *, model: Any, optimizer: Any) -> None:
    """Load the ``dcp/`` weights and AdamW state of checkpoint ``path`` into ``model`` and
    ``optimizer``, resharded for however many ranks (one, without a process group, included)
    this trainer has; every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    loaded = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(loaded, checkpoint_id=str(Path(path) / DCP_SUBDIR))
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])


def write_merged(path: str | Path, *, model: Any, named: Any, tokenizer_dir: Path, state: dict[str, Any],
                 critic: Any = None, extra: Any = None) -> Path:
    """:func:`write` for a model whose saved weights are computed (a LoRA policy: ``named`` are
    its merged ``(HF name, tensor)`` pairs): ``model/`` gets the base model's config and these
    weights (a complete HF directory), then ``extra(staging)`` adds what else the trainer keeps
    (the adapters)."""
    from safetensors.torch import save_file

    target = Path(path)
    staging = target.with_name(target.name + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)
    (staging / MODEL_SUBDIR).mkdir(parents=True)
    base = model.get_base_model()
    base.config.save_pretrained(staging / MODEL_SUBDIR)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(staging / MODEL_SUBDIR)
    save_file({name: tensor.contiguous().cpu() for name, tensor in named},
              str(staging / MODEL_SUBDIR / "model.safetensors"), metadata={"format": "pt"})
    copy_tokenizer_files(tokenizer_dir, staging / MODEL_SUBDIR)
    torch.save(state, staging / STATE_FILE)
    if critic is not None:
        from plasmid_torchtrain.critic import save_critic

        save_critic(critic, staging)
    if extra is not None:
        extra(staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target
