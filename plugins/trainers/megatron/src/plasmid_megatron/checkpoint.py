"""Checkpoint directories of the megatron trainer.

Layout of ``<path>/``::

    model/               a complete Hugging Face model directory: safetensors in HF names, streamed
                         bucket by bucket (:mod:`plasmid_megatron.hf_export`: gathered over the
                         model-parallel ranks one tensor at a time, written by global rank 0 as
                         ``model-0000i-of-0000N.safetensors`` of at most --update-weight-buffer-size
                         bytes each with ``model.safetensors.index.json``, or one ``model.safetensors``
                         when the model fits in one), --model's config.json and generation config, its
                         tokenizer files. Loads with AutoModelForCausalLM and into the engines; it
                         holds the policy's weights only.
    dist/                a megatron-core distributed checkpoint (``dist_checkpointing``, torch_dist
                         format: ``metadata.json``, ``.metadata``, ``common.pt``, ``__<rank>_<n>.distcp``)
                         of everything resumable but the random generators: the policy's (and the
                         critic's) weights, optimizer state and LR scheduler, the trainer's counters and
                         the layout it was written in. What its keys are:
                         :mod:`plasmid_megatron.sharded_state`.
    rng/rank_NNNNN.pt    one file per global rank (torch.save, ours): that rank's random generator
                         states (torch, CUDA, Python, numpy, megatron's tracker).

Resuming reshards: a checkpoint written with one parallel layout (tensor, pipeline, data, expert
parallel sizes, the world size) loads into a trainer with another, and training continues as it
would have (same weights, Adam moments and step count, LR schedule, counters). It must be resumed
with the same loss (critic or not) and the same kind of optimizer (``--megatron-optimizer``,
``--megatron-use-distributed-optimizer``, bf16/fp16): checked, with a clear error. The random
generator states are per rank, so they are restored only into the same layout; in another each rank
keeps the states its trainer was seeded with (``--seed``), which changes nothing but dropout, if
the model has any. megatron's torch_dist writer needs ``psutil``; it starts a helper process once
per trainer process (multiprocessing's spawn: the main module must be importable without side
effects) and forks a writer process per rank and save.

Writing is atomic for readers: everything goes into ``<path>.tmp``; after every rank has written,
global rank 0 moves the previous checkpoint at ``<path>`` to ``<path>.old``, renames the new one into
place and only then deletes the old one. A failure while writing leaves ``<path>`` as it was (and a
stale ``<path>.tmp``, replaced by the next save); a reader never sees a half-written ``<path>``.

:func:`write` and :func:`read` are collectives over the trainer's world: every rank calls them, in
the same order.
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

from plasmid_megatron import hf_export

MODEL_SUBDIR = "model"
DIST_SUBDIR = "dist"
RNG_SUBDIR = "rng"
#: the per-rank state directory of checkpoints written before the distributed format
LEGACY_STATE_SUBDIR = "trainer_state"
#: safetensors shard size of ``model/`` when the caller gives none (the default --update-weight-buffer-size)
DEFAULT_SHARD_BYTES = 512 * 1024**2
#: Files of a model directory copied into the checkpoint's ``model/`` besides the weights.
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer*", "special_tokens_map.json", "added_tokens.json",
               "vocab.*", "merges.txt", "chat_template*", "spiece.model", "sentencepiece*.model")


def rng_file(path: str | Path, rank: int) -> Path:
    return Path(path) / RNG_SUBDIR / f"rank_{rank:05d}.pt"


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
          sharded_state: dict[str, Any], rng: dict[str, Any], shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    """Write checkpoint ``path``.

    ``hf_tensors``: the collective Hugging Face weight export (iterated to its end on every rank,
    streamed into safetensors shards of at most ``shard_bytes`` bytes by rank 0, which holds one
    shard at a time; :func:`plasmid_megatron.hf_export.write_sharded`); ``model_dir``: where config
    and tokenizer files are copied from; ``sharded_state``: this rank's megatron sharded state dict
    (:func:`plasmid_megatron.sharded_state.sharded_state_dict`); ``rng``: this rank's :func:`rng_state`."""
    from megatron.core import dist_checkpointing

    target = Path(path)
    staging = target.with_name(target.name + ".tmp")
    rank = _rank()
    if rank == 0:
        if staging.exists():
            shutil.rmtree(staging)
        for subdir in (MODEL_SUBDIR, DIST_SUBDIR, RNG_SUBDIR):
            (staging / subdir).mkdir(parents=True)
    _barrier()
    # every rank takes part in the export's collectives; a failure to write is reported after it
    failure = hf_export.write_sharded(hf_tensors, staging / MODEL_SUBDIR, shard_bytes, writer=rank == 0)
    try:
        if failure is None:
            if rank == 0:
                copy_model_files(model_dir, staging / MODEL_SUBDIR)
            torch.save(rng, rng_file(staging, rank))
    except Exception as exc:  # noqa: BLE001 - every rank must learn of it before the collective save below
        failure = exc
    _raise_if_any_failed(failure, f"writing checkpoint {target}")
    dist_checkpointing.save(sharded_state, str(staging / DIST_SUBDIR))
    _barrier()
    if rank == 0:
        _replace(staging, target)
    _barrier()
    return target


def read(path: str | Path, sharded_state: dict[str, Any]) -> dict[str, Any]:
    """Load checkpoint ``path``'s ``dist/`` into ``sharded_state`` (this rank's sharded state dict
    for loading); returns the loaded state dict (tensors and the common state)."""
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load(sharded_state, str(dist_dir(path)))


def dist_dir(path: str | Path) -> Path:
    """``path``'s ``dist/``, checked to be a complete distributed checkpoint (a clear error if not)."""
    directory = Path(path) / DIST_SUBDIR
    if not (directory / "metadata.json").is_file():
        if (Path(path) / LEGACY_STATE_SUBDIR).is_dir():
            raise ValueError(f"{path} is a checkpoint of an earlier plasmid-megatron (per-rank {LEGACY_STATE_SUBDIR}/, "
                             f"no {DIST_SUBDIR}/) that this version cannot resume; start from its weights instead: "
                             f"--model {Path(path) / MODEL_SUBDIR}")
        raise FileNotFoundError(f"{directory / 'metadata.json'} is missing: {path} is not a complete megatron-trainer "
                                f"checkpoint")
    return directory


def read_common(path: str | Path) -> dict[str, Any]:
    """The common (not sharded) part of checkpoint ``path``'s ``dist/``, without its tensors."""
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load_common_state_dict(str(dist_dir(path)))


def read_rng(path: str | Path) -> dict[str, Any]:
    """This rank's random generator states from checkpoint ``path`` (same layout only: the file
    of this global rank)."""
    file = rng_file(path, _rank())
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: {path} is not a complete megatron-trainer checkpoint")
    return torch.load(file, map_location="cpu", weights_only=False)


def copy_model_files(source: Path, target: Path) -> list[str]:
    """Copy ``config.json``, the generation config and the tokenizer files of ``source`` to ``target``."""
    copied = []
    for pattern in MODEL_FILES:
        for file in sorted(source.glob(pattern)):
            if file.is_file() and not (target / file.name).exists():
                shutil.copy2(file, target / file.name)
                copied.append(file.name)
    return copied


def _replace(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; a previous ``target`` is moved aside first and deleted
    only once the new one is in place."""
    previous = target.with_name(target.name + ".old")
    if previous.exists():
        shutil.rmtree(previous)
    if target.exists():
        target.rename(previous)
    staging.rename(target)
    if previous.exists():
        shutil.rmtree(previous)


def _raise_if_any_failed(failure: BaseException | None, what: str) -> None:
    """Raise on every rank when ``failure`` is set on any (``failure`` itself where it happened)."""
    failed = torch.tensor([0 if failure is None else 1], dtype=torch.int32)
    if dist.is_initialized() and dist.get_world_size() > 1:
        if dist.get_backend() == "nccl":
            failed = failed.cuda()
        dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failure is not None:
        raise failure
    if int(failed.item()):
        raise RuntimeError(f"{what}: another rank failed (see its error); the previous checkpoint is unchanged")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
