"""``--loss sft``: next-token cross-entropy on each sample's demonstration (imports torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import torch

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import LossBatch, Sample
from plasmid_sft.generate import SFT_TARGET_KEY
from plasmid_sft.options import SFTOptions
from plasmid_torch import algorithms, mismatch


class SFTLoss:
    """Supervised fine-tuning: minimise ``-log p`` of the demonstration's tokens.

    Built by the kernel as ``SFTLoss(config)``. Per step:

    1. :meth:`training_samples` (called by :class:`plasmid_torch.train_step.TrainStep` before
       anything else): each sample's response becomes its demonstration
       (``metadata["sft_target_ids"]``, attached by ``--generate sft``), every token trained on,
       no rollout log-probs (the engine did not produce these tokens);
    2. :meth:`advantages`: 1.0 on every trained token (imitation weighs each demonstrated token
       alike), no returns; rewards are ignored;
    3. :meth:`policy_loss`: the token mean of ``-logprobs`` over the trained tokens, normalised
       by the step's ``total_tokens`` (micro-batches add up to the step's loss).

    Metrics of :meth:`policy_loss`: ``sft_nll`` (the loss), ``ppo_kl``
    (:func:`plasmid_torch.mismatch.policy_kl`, 0 at the first update), and ``entropy`` when given.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (SFTOptions,)
    needs_ref = False
    needs_critic = False
    needs_old_logprobs = False

    def __init__(self, config: Config) -> None:
        SFTOptions.of(config)          # nothing to read yet beyond what --generate sft reads

    def training_samples(self, samples: Sequence[Sample], rollout_id: int = 0) -> list[Sample]:
        """``samples`` with each response replaced by its demonstration (prompt tokens kept); a
        sample without one is a ``ValueError`` naming it and ``--generate sft``. Every step is
        alike: ``rollout_id`` is not read."""
        trained = []
        for position, sample in enumerate(samples):
            target = sample.metadata.get(SFT_TARGET_KEY)
            if not target:
                raise ValueError(f"--loss sft: sample {position} (index {sample.index}, group {sample.group_index}) "
                                 f"has no demonstration (metadata[{SFT_TARGET_KEY!r}]): generate with --generate sft, "
                                 f"which attaches each prompt's label")
            target = [int(token) for token in target]
            trained.append(replace(sample, tokens=sample.prompt_tokens + target, response_length=len(target),
                                   loss_mask=[1] * len(target), rollout_logprobs=None))
        return trained

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        """``(response_mask as float, None)``: every trained token weighs 1."""
        return batch.response_mask.float(), None

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """The step-normalised token mean of ``-logprobs`` and its metrics (see the class docstring)."""
        loss = algorithms.aggregate(-logprobs, batch.response_mask, "token-mean", total_tokens=batch.total_tokens,
                                    total_samples=batch.total_samples)
        metrics = {"sft_nll": float(loss.detach()), "ppo_kl": mismatch.policy_kl(batch, logprobs)}
        if entropy is not None:
            metrics["entropy"] = float(algorithms.aggregate(entropy.detach(), batch.response_mask, "token-mean",
                                                            total_tokens=batch.total_tokens,
                                                            total_samples=batch.total_samples))
        return loss, metrics
