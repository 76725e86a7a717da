"""What every trainer plugin checks and measures the same way (imports torch).

Not imported by ``import plasmid``; trainer plugins import it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from plasmid.types import Sample


def check_samples(samples: Sequence[Sample]) -> None:
    """Raise ``ValueError`` naming the first sample a trainer cannot train on: no response
    tokens, no prompt token before the response, or a ``loss_mask`` / ``rollout_logprobs``
    whose length is not ``response_length``."""
    for position, sample in enumerate(samples):
        where = f"sample {position} (index {sample.index}, group {sample.group_index})"
        if sample.response_length < 1:
            raise ValueError(f"{where} has no response tokens (response_length={sample.response_length}); "
                             f"drop it before training")
        if sample.prompt_length < 1:
            raise ValueError(f"{where} has no prompt token before its response (tokens={len(sample.tokens)}, "
                             f"response_length={sample.response_length}): the first response token needs a prefix")
        if sample.loss_mask is not None and len(sample.loss_mask) != sample.response_length:
            raise ValueError(f"{where}: loss_mask has {len(sample.loss_mask)} entries for "
                             f"{sample.response_length} response tokens")
        if sample.rollout_logprobs is not None and len(sample.rollout_logprobs) != sample.response_length:
            raise ValueError(f"{where}: rollout_logprobs has {len(sample.rollout_logprobs)} entries for "
                             f"{sample.response_length} response tokens")


def updates_per_rollout(option: Any) -> int:
    """Optimizer updates per RL step: one per ``--global-batch-size`` samples of the step's
    ``--prompts-per-step`` x ``--n-samples-per-prompt`` (one when the global batch size is unset)."""
    if not option.global_batch_size:
        return 1
    samples = option.prompts_per_step * option.n_samples_per_prompt
    return max(1, math.ceil(samples / option.global_batch_size))


def rollout_logprob_abs_diff(samples: Sequence[Sample], trainer_logprobs: torch.Tensor,
                             mask: torch.Tensor) -> float | None:
    """``train_rollout_logprob_abs_diff``: the mean over trained tokens of
    ``|trainer log-prob - engine log-prob|`` (``trainer_logprobs`` and ``mask`` are ``[B, T]``
    aligned with ``samples``' responses). Samples without rollout log-probs are skipped;
    ``None`` when none has them. After a correct weight sync this is float rounding (<= 1e-4)."""
    total, count = 0.0, 0.0
    for row, sample in enumerate(samples):
        if sample.rollout_logprobs is None:
            continue
        length = sample.response_length
        engine = torch.tensor(sample.rollout_logprobs, dtype=torch.float32)
        row_mask = mask[row, :length]
        total += float(((trainer_logprobs[row, :length] - engine).abs() * row_mask).sum())
        count += float(row_mask.sum())
    return total / count if count else None


def batch_metrics(samples: Sequence[Sample], advantages: torch.Tensor, mask: torch.Tensor,
                  trainer_logprobs: torch.Tensor | None) -> dict[str, float]:
    """The per-step metrics every trainer reports about the batch it trained on: advantage
    mean/std over trained tokens, ``train_rollout_logprob_abs_diff`` (when both log-probs exist),
    samples and trained tokens; ``advantages``, ``mask``, ``trainer_logprobs`` are ``[B, T]``."""
    trained = advantages[mask > 0]
    metrics = {
        "train/advantage_mean": float(trained.mean()) if trained.numel() else 0.0,
        "train/advantage_std": float(trained.std(unbiased=False)) if trained.numel() else 0.0,
        "train/samples": float(len(samples)),
        "train/tokens": float(mask.sum()),
    }
    if trainer_logprobs is not None:
        diff = rollout_logprob_abs_diff(samples, trainer_logprobs, mask)
        if diff is not None:
            metrics["train/train_rollout_logprob_abs_diff"] = diff
    return metrics
