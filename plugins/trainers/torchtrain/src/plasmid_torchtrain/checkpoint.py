"""Checkpoint directories of the torch trainer.

Layout of ``<path>/``::

    model/               a complete Hugging Face model directory (safetensors weights, config,
                         generation config, and the tokenizer files of --model): loads with
                         AutoModelForCausalLM / AutoTokenizer.from_pretrained (a vision-language
                         model: AutoModelForImageTextToText / AutoImageProcessor, its processor
                         configs copied too)
    trainer_state.pt     optimizer and LR-scheduler state (the critic's too), RNG states
                         (torch, random, numpy), and the trainer's counters (torch.save; our
                         own file, loaded with weights_only=False)
    critic.safetensors   the critic's weights (backbone and value head), when the loss has one
    adapter/             (a LoRA policy, --lora-rank; :func:`write_adapters`) the adapters in peft's
                         format; model/ then holds the merged weights, and dcp/ the adapters and
                         their AdamW state (the frozen base weights are --model's), whatever the
                         number of ranks, so any number of ranks resumes them

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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

MODEL_SUBDIR = "model"
DCP_SUBDIR = "dcp"
STATE_FILE = "trainer_state.pt"
#: Files of a model directory that belong to its tokenizer, and a vision-language model's image/video
#: processor configs (copied into checkpoints and exports, so they load as the VLM they are).
TOKENIZER_PATTERNS = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
                      "chat_template*", "spiece.model", "sentencepiece*.model", "preprocessor_config.json",
                      "processor_config.json", "video_preprocessor_config.json")


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
    return seal(staging, target, state, critic)


def seal(staging: Path, target: Path, state: dict[str, Any], critic: Any = None) -> Path:
    """Finish a checkpoint written into ``staging``: add ``state`` and the ``critic`` (when given),
    then put it in place of ``target`` (an existing checkpoint there is replaced). Called by one
    process, the writer, once everything else is in ``staging``; returns ``target``."""
    torch.save(state, staging / STATE_FILE)
    if critic is not None:
        from plasmid_torchtrain.critic import save_critic

        save_critic(critic, staging)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def replace_directory(target: Path, write: Any) -> Path:
    """``write(staging)`` fills a fresh directory beside ``target``, which then replaces
    ``target`` (a reader of ``target`` never sees it half-written)."""
    staging = target.with_name(target.name + ".tmp")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    write(staging)
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
        seal(staging, target, state, critic)
    dist.barrier()
    return target


def is_sharded(path: str | Path) -> bool:
    """Whether checkpoint ``path`` was written by a sharded trainer (it has ``dcp/``)."""
    return (Path(path) / DCP_SUBDIR).is_dir()


def read_sharded(path: str | Path, *, model: Any, optimizer: Any, collective: bool,
                 trainable_only: bool = False) -> None:
    """Load the ``dcp/`` weights and AdamW state of checkpoint ``path`` into ``model`` and
    ``optimizer``, resharded for however many ranks (one, without a process group, included)
    this trainer has. ``collective`` (a sharded model): every rank calls it together; otherwise
    the calling process reads all of it alone. ``trainable_only`` (a LoRA policy, whose
    ``dcp/`` holds the adapters alone, :func:`write_adapters`): only the parameters that train
    (the frozen ones keep ``--model``'s values); one the checkpoint lacks is an error of ``dcp``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    options = StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    loaded = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(loaded, checkpoint_id=str(Path(path) / DCP_SUBDIR), no_dist=not collective)
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"],
                   options=options)


def write_adapters(path: str | Path, *, model: Any, optimizer: Any, merged: Iterable[list[tuple[str, torch.Tensor]]],
                   tokenizer_dir: Path, state: dict[str, Any], rank: int, collective: bool,
                   critic: Any = None) -> Path:
    """The checkpoint of a LoRA policy (``model``, a peft model, sharded with FSDP2 or not) at ``path``,
    atomically as :func:`write`: ``dcp/`` the adapters and their AdamW state (``torch.distributed.
    checkpoint``, each rank its shards; frozen base weights left out), ``adapter/`` the adapters
    gathered whole in peft's format, ``model/`` the merged weights ``merged`` (buckets of whole CPU
    tensors, :meth:`TorchTrainer.export_weights`) written one safetensors file per bucket under
    ``save_pretrained``'s names, so no rank holds more than one bucket of whole tensors; ``state``
    and the ``critic`` beside them. ``collective`` (a sharded model): every rank calls it and rank
    0 writes all but its shards of ``dcp/``; otherwise one process (``rank`` 0) writes everything."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from plasmid_torch.disk_sync import name_shards
    from plasmid_torchtrain.lora import ADAPTER_SUBDIR, adapter_state, save_adapters

    target = Path(path)
    staging = target.with_name(target.name + ".tmp")
    writer = rank == 0
    if writer:
        if staging.exists():
            shutil.rmtree(staging)
        (staging / MODEL_SUBDIR).mkdir(parents=True)
    if collective:
        dist.barrier()
    trained, optimizer_state = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    dcp.save({"model": trained, "optimizer": optimizer_state}, checkpoint_id=str(staging / DCP_SUBDIR),
             no_dist=not collective)
    adapters = adapter_state(model)
    shards: list[tuple[str, list[str]]] = []
    total = 0
    for index, bucket in enumerate(merged):
        if writer:
            file = f"bucket-{index:05d}.safetensors"
            save_file(dict(bucket), str(staging / MODEL_SUBDIR / file), metadata={"format": "pt"})
            shards.append((file, [name for name, _ in bucket]))
            total += sum(tensor.numel() * tensor.element_size() for _, tensor in bucket)
    if writer:
        base = model.get_base_model()
        base.config.save_pretrained(staging / MODEL_SUBDIR)
        if getattr(base, "generation_config", None) is not None:
            base.generation_config.save_pretrained(staging / MODEL_SUBDIR)
        name_shards(staging / MODEL_SUBDIR, shards, total)
        copy_tokenizer_files(tokenizer_dir, staging / MODEL_SUBDIR)
        save_adapters(model, staging / ADAPTER_SUBDIR, adapters)
        seal(staging, target, state, critic)
    if collective:
        dist.barrier()
    return target
