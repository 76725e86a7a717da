"""``--loss sft-mix``: SFT steps mixed with the steps of an RL loss, one trainer, one run (imports torch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from plasmid import providers
from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.options import Options
from plasmid.protocols import SupportsOldLogprobsDeclaration, SupportsReferenceScores, SupportsTrainingSamples
from plasmid.registry import Registry
from plasmid.types import LossBatch, Sample
from plasmid_sft.loss import SFTLoss
from plasmid_sft.options import SFTMixOptions, SFTOptions


class SFTMixLoss:
    """Every ``--sft-mix-every``-th train step an SFT step, the others steps of ``--sft-mix-loss``.

    Built by the kernel as ``SFTMixLoss(config)``; it builds the two losses it delegates to: an
    :class:`plasmid_sft.loss.SFTLoss`, and the RL loss ``--sft-mix-loss`` from ``registry``
    (default: the run's plugin lock, loaded in this process: :func:`plasmid.providers.build`), with
    the run's options. Samples come from ``--generate sft`` (the default): the policy's own
    responses, rewarded, each with its prompt's demonstration attached, so either kind of step can
    train on any batch.

    Per step, :meth:`training_samples` (which :class:`plasmid_torch.train_step.TrainStep` calls
    first, with the batch's rollout id) picks its kind: rollout ``r`` (0-based, as the loop counts
    them) is an SFT step when ``(r + 1) % --sft-mix-every == 0``. The kind depends on the rollout id
    alone, so a resumed run keeps the schedule of an uninterrupted one, and every data-parallel
    rank agrees.
    Everything else the recipe asks of the loss that step (its samples, ``needs_old_logprobs``,
    ``advantages_read_old_logprobs``, ``reference_logprobs_key``, :meth:`advantages`,
    :meth:`policy_loss`) is then exactly that loss's, so an SFT step is a ``--loss sft`` step and an
    RL step a step of the RL loss, on the same weights, optimizer and checkpoints. Why steps and not
    one objective with both terms: a step's :class:`plasmid.types.LossBatch` has no way to tell a
    demonstration row from a sampled one in a micro-batch, and the rollout's log-probs, the
    rollout corrections (``--tis``/``--icepop``) and the mismatch metrics are all-or-nothing over
    the batch's rows; steps of one kind keep every one of them exact.

    ``needs_ref`` is the RL loss's (the trainer keeps a reference for it). Metric: ``sft_step``
    (1 on SFT steps, 0 on RL steps), besides the step's own loss's.

    :raises UsageError: ``--sft-mix-loss`` is ``sft`` or ``sft-mix``, needs a critic (it would be
        trained on demonstrations), or reads per-sample scores from its own generate function
        (``reference_logprobs_key``, as ``opd``'s teacher): ``--generate sft`` attaches none.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (SFTOptions, SFTMixOptions)
    needs_critic = False

    def __init__(self, config: Config, registry: Registry | None = None) -> None:
        options = SFTMixOptions.of(config)
        name = options.sft_mix_loss
        if name in ("sft", "sft-mix"):
            raise UsageError(f"--sft-mix-loss {name}: give the RL loss to mix SFT steps with (grpo, ppo, ...)")
        #: the RL loss of the steps that are not SFT steps
        self.rl: Any = providers.build("loss", name, config, registry=registry, flag="--sft-mix-loss")
        if getattr(self.rl, "needs_critic", False):
            raise UsageError(f"--sft-mix-loss {name} needs a critic, which SFT steps would train on demonstrations; "
                             f"mix SFT with a loss without one (grpo, rloo, reinforce++, ...)")
        if isinstance(self.rl, SupportsReferenceScores) and self.rl.reference_logprobs_key:
            raise UsageError(f"--sft-mix-loss {name} reads scores its own generate function attaches "
                             f"({self.rl.reference_logprobs_key!r}); --generate sft attaches demonstrations only")
        #: the loss of the SFT steps
        self.sft = SFTLoss(config)
        self.every: int = options.sft_mix_every
        #: the rollout id of the current step (the last :meth:`training_samples` call's); None before
        self.rollout_id: int | None = None

    @property
    def sft_step(self) -> bool:
        """Whether the current step (the last :meth:`training_samples` call's) is an SFT step."""
        return self.rollout_id is not None and (self.rollout_id + 1) % self.every == 0

    @property
    def current(self) -> Any:
        """The loss of the current step: :attr:`sft` or :attr:`rl`."""
        return self.sft if self.sft_step else self.rl

    @property
    def needs_ref(self) -> bool:
        return bool(self.rl.needs_ref)

    @property
    def needs_old_logprobs(self) -> bool:
        return bool(self.current.needs_old_logprobs)

    @property
    def advantages_read_old_logprobs(self) -> bool:
        current = self.current
        return not isinstance(current, SupportsOldLogprobsDeclaration) or bool(current.advantages_read_old_logprobs)

    @property
    def reference_logprobs_key(self) -> str | None:
        current = self.current
        return current.reference_logprobs_key if isinstance(current, SupportsReferenceScores) else None

    def training_samples(self, samples: Sequence[Sample], rollout_id: int = 0) -> list[Sample]:
        """Begin the step of rollout ``rollout_id``: the samples its loss trains on (demonstrations on
        an SFT step)."""
        self.rollout_id = rollout_id
        current = self.current
        if isinstance(current, SupportsTrainingSamples):
            return current.training_samples(samples, rollout_id=rollout_id)
        return list(samples)

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The current step's loss's advantages."""
        advantages: tuple[torch.Tensor, torch.Tensor | None] = self.current.advantages(batch)
        return advantages

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor,
                    entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """The current step's loss and metrics, and ``sft_step`` (normalised like them: the micro-batches
        of an update sum to 1 on an SFT step)."""
        loss, metrics = self.current.policy_loss(batch, logprobs, entropy)
        share = batch.response_mask.shape[0] / batch.total_samples if self.sft_step else 0.0
        return loss, {**metrics, "sft_step": float(share)}
