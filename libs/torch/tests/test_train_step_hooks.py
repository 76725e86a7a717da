"""What a loss may ask of the train-step recipe: the samples it trains on (``training_samples``,
plasmid-sft) and reference log-probs read from the samples (``reference_logprobs_key``, plasmid-opd)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from plasmid.types import Group, LossBatch, RolloutBatch, Sample, Status
from plasmid_torch.train_step import TrainerParts, TrainStep
from plasmid_torch.trainer_options import TrainerOptions


def batch_of(*samples: Sample, rollout_id: int = 0) -> RolloutBatch:
    return RolloutBatch(rollout_id=rollout_id, groups=[Group(samples=list(samples), index=0)])


def sample(response: list[int], **fields: Any) -> Sample:
    return Sample(tokens=[1, 2, *response], response_length=len(response), reward=1.0, status=Status.COMPLETED,
                  rollout_logprobs=[-0.5] * len(response), **fields)


class Loss:
    needs_critic = False
    needs_ref = False
    needs_old_logprobs = True

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)
        self.seen: LossBatch | None = None

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        self.seen = batch
        return batch.response_mask, None


def run(loss: Any, batch: RolloutBatch) -> tuple[dict[str, float], list[Any]]:
    prepared: list[Any] = []

    def prepare(samples: list[Sample]) -> list[Sample]:
        prepared.extend(samples)
        return samples

    def logprobs(model: Any, inputs: list[Sample], temperature: float) -> torch.Tensor:
        width = max(s.response_length for s in inputs)
        return torch.full((len(inputs), width), -0.5)

    parts = TrainerParts(loss=loss, policy="policy", reference=None, logprobs=logprobs,
                         policy_update=lambda batch, inputs, chunk: {"loss": 0.0, "ppo_kl": 0.25}, prepare=prepare)
    metrics = TrainStep(parts, TrainerOptions.defaults(), temperature=1.0).run(batch)
    return metrics, prepared


def test_a_loss_with_training_samples_trains_on_what_it_returns():
    rollout_ids = []

    def longer(samples: list[Sample], rollout_id: int) -> list[Sample]:
        rollout_ids.append(rollout_id)
        return [replace(s, tokens=s.prompt_tokens + [7, 8, 9], response_length=3, loss_mask=[1, 1, 1],
                        rollout_logprobs=None) for s in samples]

    loss = Loss(training_samples=longer)
    metrics, prepared = run(loss, batch_of(sample([5]), sample([6]), rollout_id=7))
    assert [s.tokens for s in prepared] == [[1, 2, 7, 8, 9]] * 2
    assert metrics["train/tokens"] == 6.0 and tuple(loss.seen.response_mask.shape) == (2, 3)
    assert loss.seen.rollout_logprobs is None and "train/mismatch_kl" not in metrics
    assert metrics["train/ppo_kl"] == 0.25
    assert rollout_ids == [7]                                        # the batch's, for losses that vary by step


def test_reference_logprobs_come_from_the_samples_metadata_when_the_loss_names_a_key():
    loss = Loss(reference_logprobs_key="teacher")
    metrics, _ = run(loss, batch_of(sample([5, 6], metadata={"teacher": [-1.0, -2.0]}),
                                    sample([7], metadata={"teacher": [-3.0]})))
    assert torch.equal(loss.seen.ref_logprobs, torch.tensor([[-1.0, -2.0], [-3.0, 0.0]]))
    assert metrics["train/mismatch_kl"] == 0.0 and metrics["train/token_prob_ratio_max"] == 1.0


@pytest.mark.parametrize(("metadata", "found"), [({}, "none"), ({"teacher": [-1.0]}, "1 entries")])
def test_a_sample_without_its_reference_logprobs_is_named(metadata, found):
    loss = Loss(reference_logprobs_key="teacher")
    with pytest.raises(ValueError, match=rf"sample 1 \(index 4, group 0\).*'teacher'.*{found} for 2 response"):
        run(loss, batch_of(sample([5, 6], metadata={"teacher": [-1.0, -2.0]}), sample([7, 8], metadata=metadata,
                                                                                      index=4)))
