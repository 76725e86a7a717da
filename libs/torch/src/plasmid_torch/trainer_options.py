"""The options every trainer shares (the "training" group), declared by each trainer plugin that reads them.

A trainer plugin declares the class in its hook and reads it typed, once, when the trainer is
built::

    @hookimpl
    def plasmid_addoption(parser):
        parser.add_options(TrainerOptions)

    options = TrainerOptions.of(config)        # in the trainer's __init__

(declaring one class from several plugins is allowed). Options of a single trainer live in that
plugin (``plasmid_megatron.options.MegatronOptions``). This module imports no torch: plugins
import it when they declare options, before any trainer is chosen.
"""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class TrainerOptions(Options, group="training", description="shared by every trainer"):
    """The optimizer, its learning-rate schedule, batching into updates and micro-batches (by samples,
    and by tokens with ``--max-tokens-per-micro-batch``), passes over each rollout
    (``--num-iterations``), the
    critic's learning rate and warm-up, and the bound on how far one step may move the weights
    (``--max-update-ratio``, :mod:`plasmid_torch.step_guard`).

    Derived: :attr:`critic_learning_rate` (``--critic-lr``, else ``--lr``).
    """

    lr: float = option(1e-6, "learning rate", gt=0, default_text="1e-06; the quickstart recipe: 5e-4")
    lr_schedule: Literal["constant", "linear", "cosine"] = option("constant", "learning-rate schedule")
    lr_warmup_steps: int = option(0, "optimizer updates of linear warm-up", min=0)
    min_lr: float = option(0.0, "the schedule's final learning rate", min=0)
    weight_decay: float = option(0.0, "AdamW weight decay", min=0)
    adam_beta1: float = option(0.9, "AdamW beta1", min=0, max=1)
    adam_beta2: float = option(0.99, "AdamW beta2", min=0, max=1)
    clip_grad: float = option(1.0, "max global grad norm (0: off)", min=0)
    global_batch_size: int | None = option(None, "samples per optimizer step", min=1,
                                           default_text="the whole rollout, one update per step")
    num_iterations: int = option(
        1, "passes over each rollout's samples (TRL's num_iterations, PPO epochs): every pass makes the step's "
        "--global-batch-size updates again, in the same order, against the old log-probs taken once before the "
        "first pass, so from the second pass the ratio and its clip act as in PPO", min=1)
    micro_batch_size: int = option(256, "samples per forward/backward", min=1)
    max_tokens_per_micro_batch: int | None = option(
        None, "cut micro-batches by a budget of tokens as well as --micro-batch-size samples: torchtrain counts "
        "each sample's prompt + response tokens, in order (a longer sample is a micro-batch of its own); megatron "
        "packs padded tokens (samples x longest), longest first", min=1, default_text="off")
    critic_lr: float | None = option(None, "learning rate of the critic, for losses that need one", gt=0,
                                     default_text="--lr")
    critic_warmup_steps: int = option(0, "with a loss that trains a critic: the first N steps train only the "
                                      "critic, the policy is not updated (a loss without a critic ignores it)",
                                      min=0)
    max_update_ratio: float = option(1.0, "refuse a train step whose updates move the trained weights by more "
                                     "than this times their norm (||w - w0|| / ||w0||) or make one non-finite; "
                                     "the step's weights and optimizer state are put back from a copy "
                                     "(0: no weight check, and no copy with one update per step)", min=0)

    @property
    def critic_learning_rate(self) -> float:
        """The critic's peak learning rate: ``--critic-lr``, else ``--lr``."""
        return self.lr if self.critic_lr is None else self.critic_lr


__all__ = ["TrainerOptions"]
