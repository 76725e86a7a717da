"""Through the real trainer, tokens with ``loss_mask`` 0 (a multi-turn sample's tool and environment
text) change nothing: ``TorchTrainer.train_step`` on a multi-turn batch gives the same weights and
the same metrics (loss, KL, entropy, the rollout correction, the train/rollout mismatch, ...) when
what the masked tokens carry is changed, and different ones when the same change is made on one
trained token (the check can fail).

What is changed on the masked tokens: the engine's log-probs (``rollout_logprobs``, read by
``--tis``), the old and reference log-probs the step computes (its no-grad passes, shifted where
the tokens are masked), and the ids of the *trailing* masked tokens (a tool answer that ends the
sample; masked tokens in the middle are context of the turns after them, so their ids do count).

Each case runs GRPO with a KL term against the reference and an entropy bonus, in micro-batches
of 3, on three paths of :class:`plasmid_torch.train_step.TrainStep`: the exactly on-policy step,
whose old log-probs are its update's own forward (:meth:`TrainStep.reuses_update_forward`; there
the old-log-prob shift has nothing to act on), and two steps with a separate old-log-prob pass:
two optimizer updates (``--global-batch-size``), and the KL as a reward penalty (``--kl-coef``).
The loss-level counterpart, with per-token gradients, is libs/torch/tests/test_loss_mask_gradients.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import plasmid_grpo.plugin
import plasmid_torchtrain.plugin
import pytest
import torch

from plasmid import testing
from plasmid.types import Group, RolloutBatch, Sample, Status
from plasmid_torch.tiny import BOS_ID, SPECIAL_TOKENS

#: The tiny model's vocabulary: its special tokens, then the quickstart alphabet.
VOCAB = 16
FIRST_REGULAR = len(SPECIAL_TOKENS)

#: The response of each sample as (tokens, trained) turns: a model turn is trained (loss_mask 1),
#: a tool answer is not. Most end in a tool answer (trailing masked tokens), one in a model turn.
LAYOUTS = [
    [(3, True), (4, False), (2, True), (3, False)],
    [(2, True), (2, False), (4, True), (1, False)],
    [(4, True), (3, False), (3, True)],
    [(1, True), (5, False), (2, True), (2, False)],
]
REWARDS = [[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.25]]

#: Option sets, each with the trainer path it takes: whether the old log-probs come from the update's forward.
PATHS = {
    "on-policy-reused-forward": ({"kl_loss_coef": 0.1}, True),
    "two-updates-separate-old-pass": ({"kl_loss_coef": 0.1, "global_batch_size": 4}, False),
    "kl-reward-penalty-separate-old-pass": ({"kl_coef": 0.1}, False),
}

#: Log-prob shifts: on the engine's, the step's old (policy) and reference log-probs.
ROLLOUT_SHIFT, OLD_SHIFT, REF_SHIFT = -2.5, -3.0, 4.0


def multiturn_batch(seed: int = 0) -> RolloutBatch:
    """Two groups of four samples laid out as :data:`LAYOUTS` (random ids, rewards :data:`REWARDS`);
    ``rollout_logprobs`` 0 on the masked tokens (as the multi-turn generate function leaves them),
    filled in on the trained ones by :func:`with_engine_logprobs`."""
    rng = random.Random(seed)
    groups = []
    for group_index, rewards in enumerate(REWARDS):
        prompt = [BOS_ID] + [rng.randrange(FIRST_REGULAR, VOCAB) for _ in range(3)]
        samples = []
        for k, (layout, reward) in enumerate(zip(LAYOUTS, rewards, strict=True)):
            response, mask = [], []
            for length, trained in layout:
                response += [rng.randrange(FIRST_REGULAR, VOCAB) for _ in range(length)]
                mask += [int(trained)] * length
            samples.append(Sample(prompt="", tokens=prompt + response, response_length=len(response), loss_mask=mask,
                                  reward=reward, status=Status.COMPLETED, index=group_index * len(LAYOUTS) + k,
                                  group_index=group_index, weight_version=0))
        groups.append(Group(samples=samples, index=group_index))
    return RolloutBatch(rollout_id=0, groups=groups)


def with_engine_logprobs(trainer, batch: RolloutBatch) -> RolloutBatch:
    """The trainer's own log-probs, slightly off, as the engine's on the trained tokens (so the
    importance weights of ``--tis`` are not all 1), 0 on the masked ones."""
    values = testing.run(trainer.logprobs(batch.samples, 1.0))
    for sample, logprobs in zip(batch.samples, values, strict=True):
        sample.rollout_logprobs = [value + 0.05 * (index % 3 - 1) if trained else 0.0
                                   for index, (value, trained) in enumerate(zip(logprobs, sample.loss_mask,
                                                                                strict=True))]
    return batch


# -- which response tokens a perturbation acts on ------------------------------------------------

def masked(sample: Sample) -> list[int]:
    """Every masked response position (tool answers in the middle and at the end)."""
    return [i for i, trained in enumerate(sample.loss_mask) if not trained]


def trailing_masked(sample: Sample) -> list[int]:
    """The masked response positions after the sample's last trained token."""
    last_trained = max(i for i, trained in enumerate(sample.loss_mask) if trained)
    return list(range(last_trained + 1, sample.response_length))


def one_trained(sample: Sample) -> list[int]:
    """The control: the first sample's last trained token, else nothing."""
    if sample.index != 0:
        return []
    return [max(i for i, trained in enumerate(sample.loss_mask) if trained)]


Positions = Callable[[Sample], list[int]]


def shift_logprobs(trainer, batch: RolloutBatch, where: Positions) -> None:
    """Shift the engine's log-probs at ``where``, and make the step's no-grad passes return their
    old (policy) and reference log-probs shifted there."""
    samples = batch.samples
    for sample in samples:
        for position in where(sample):
            sample.rollout_logprobs[position] += ROLLOUT_SHIFT
    width = max(sample.response_length for sample in samples)
    at = torch.zeros(len(samples), width)
    for row, sample in enumerate(samples):
        at[row, where(sample)] = 1.0
    parts = trainer.recipe.parts
    passes = parts.logprobs

    def shifted(model, inputs, temperature):
        shift = REF_SHIFT if model is parts.reference else OLD_SHIFT
        return passes(model, inputs, temperature) + shift * at

    trainer.recipe.parts = replace(parts, logprobs=shifted)


def change_ids(trainer, batch: RolloutBatch, where: Positions) -> None:
    """Give the response tokens at ``where`` other ids."""
    for sample in batch.samples:
        for position in where(sample):
            at = sample.prompt_length + position
            sample.tokens[at] = FIRST_REGULAR + (sample.tokens[at] - FIRST_REGULAR + 5) % (VOCAB - FIRST_REGULAR)


PERTURBATIONS = {
    # (perturb(trainer, batch, where), the masked positions it is made on)
    "rollout-old-and-ref-logprobs": (shift_logprobs, masked),
    "trailing-token-ids": (change_ids, trailing_masked),
}


@pytest.fixture
def train_step(model_dir, tmp_path):
    """``train_step(options, perturb=None, where=None)``: a fresh trainer's metrics (no timings)
    and weights after one step on :func:`multiturn_batch`, ``perturb(trainer, batch, where)`` first."""
    def run(options, perturb=None, where=None):
        options = {"lr": 1e-2, "model": str(model_dir), "run_dir": tmp_path / "run", "micro_batch_size": 3,
                   "entropy_coef": 0.01, "tis": True, **options}
        config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, **options)
        loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
        trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
        batch = with_engine_logprobs(trainer, multiturn_batch())
        if perturb is not None:
            perturb(trainer, batch, where)
        metrics = testing.run(trainer.train_step(batch))
        weights = {name: parameter.detach().clone() for name, parameter in trainer.model.named_parameters()}
        return trainer, {k: v for k, v in metrics.items() if "seconds" not in k}, weights

    return run


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return [name for name in a if not torch.equal(a[name], b[name])]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("perturbation", list(PERTURBATIONS))
@pytest.mark.parametrize("path", list(PATHS))
def test_what_masked_tokens_carry_changes_neither_the_weights_nor_the_metrics(train_step, path, perturbation):
    options, reuses_forward = PATHS[path]
    perturb, where = PERTURBATIONS[perturbation]
    trainer, metrics, weights = train_step(options)
    assert trainer.recipe.reuses_update_forward(int(metrics["train/updates"])) is reuses_forward
    assert {"train/loss", "train/kl", "train/entropy", "train/tis_weight_mean"} <= set(metrics)
    assert metrics["train/tokens"] < sum(sample.response_length for sample in multiturn_batch().samples)

    _, masked_metrics, masked_weights = train_step(options, perturb, where)
    assert masked_metrics == metrics
    assert differing(masked_weights, weights) == []

    _, control_metrics, control_weights = train_step(options, perturb, one_trained)
    assert control_metrics["train/loss"] != metrics["train/loss"]
    assert differing(control_weights, weights)
