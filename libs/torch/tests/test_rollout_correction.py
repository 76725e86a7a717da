"""Masked and truncated importance sampling at token, sequence and geometric level
(plasmid_torch.algorithms.rollout_correction, ``--tis-mode``), against hand-computed weights, and
through the shared loss base that every loss using old log-probs inherits."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import LossBatch
from plasmid_torch import algorithms
from plasmid_torch.loss_options import PolicyGradientOptions

LN2, LN3 = math.log(2.0), math.log(3.0)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# d = old - rollout: sample 0 [ln2, ln2, -ln2] (sequence ratio 2, geometric 2^(1/3));
# sample 1 [ln3, ln3, masked 100] (sequence ratio 9, geometric 3): the masked token never counts
OLD = torch.tensor([[LN2, LN2, -LN2], [LN3, LN3, 100.0]]) - 3.0
ROLLOUT = torch.full((2, 3), -3.0)


def per_sample(first: float, second: float) -> torch.Tensor:
    return torch.tensor([[first] * 3, [second] * 3])


@pytest.mark.parametrize(("mode", "level", "band", "weights", "outside"), [
    ("truncate", "token", (0.0, 2.5), [[2, 2, 0.5], [2.5, 2.5, 2.5]], [[0, 0, 0], [1, 1, 1]]),
    ("mask", "token", (0.5, 2.5), [[2, 2, 0.5], [0, 0, 0]], [[0, 0, 0], [1, 1, 1]]),
    ("truncate", "sequence", (0.0, 2.0), per_sample(2, 2), per_sample(0, 1)),
    ("mask", "sequence", (0.5, 5.0), per_sample(2, 0), per_sample(0, 1)),
    ("truncate", "geometric", (0.0, 2.0), per_sample(2 ** (1 / 3), 2), per_sample(0, 1)),
    ("mask", "geometric", (0.5, 2.5), per_sample(2 ** (1 / 3), 0), per_sample(0, 1)),
    ("mask", "geometric", (0.5, 1.2), per_sample(0, 0), per_sample(1, 1)),
])
def test_weights_are_the_hand_computed_ones(mode, level, band, weights, outside):
    correction = algorithms.rollout_correction(OLD, ROLLOUT, low=band[0], high=band[1], mode=mode, level=level,
                                               mask=MASK)
    trained = MASK > 0
    expected = torch.as_tensor(weights, dtype=torch.float32)
    assert torch.allclose(correction.weights[trained], expected[trained], rtol=1e-5)
    assert torch.equal(correction.outside[trained], torch.as_tensor(outside, dtype=torch.float32)[trained])


def test_a_sequence_ratio_is_clamped_before_exp_and_its_weight_stays_finite():
    old = torch.full((1, 40), 0.0)
    rollout = torch.full((1, 40), -1.0)                    # sequence log-ratio 40 > LOG_RATIO_LIMIT
    correction = algorithms.rollout_correction(old, rollout, low=0.0, high=2.0, level="sequence",
                                               mask=torch.ones(1, 40))
    assert torch.isfinite(correction.ratio).all()
    assert float(correction.ratio[0, 0]) == pytest.approx(math.exp(algorithms.LOG_RATIO_LIMIT), rel=1e-5)
    assert torch.all(correction.weights == 2.0)


def test_sequence_levels_need_the_mask_and_unknown_levels_are_refused():
    with pytest.raises(ValueError, match="needs the response mask"):
        algorithms.rollout_correction(OLD, ROLLOUT, low=0.0, high=2.0, level="sequence")
    with pytest.raises(ValueError, match="--tis-mode"):
        algorithms.rollout_correction(OLD, ROLLOUT, low=0.0, high=2.0, level="segment", mask=MASK)


def test_the_option_choices_are_the_levels_the_math_implements():
    hints = typing.get_type_hints(PolicyGradientOptions)
    assert typing.get_args(hints["tis_mode"]) == algorithms.ROLLOUT_CORRECTION_LEVELS


def loss_of(provider: str, plugin_name: str, **options):
    plugin = pytest.importorskip(plugin_name)
    config = testing.make_config(plugin, **options)
    return testing.build("loss", provider, plugin, config=config)


def test_sequence_mis_drops_whole_samples_from_the_shared_policy_loss():
    loss = loss_of("grpo", "plasmid_grpo.plugin", icepop=True, tis_mode="sequence")       # band [0.5, 5]
    batch = LossBatch(rewards=torch.tensor([1.0, 0.0]), group_index=torch.zeros(2, dtype=torch.long),
                      response_mask=MASK, old_logprobs=OLD, rollout_logprobs=ROLLOUT, total_tokens=5, total_samples=2)
    batch.advantages, _ = loss.advantages(batch)
    logprobs = OLD.clone().requires_grad_(True)
    value, metrics = loss.policy_loss(batch, logprobs, None)
    value.backward()
    # ratio 1 (on-policy), advantages +-1/sqrt(2) (std of [1, 0] is 1/sqrt(2)): sample 0 weighs 2, sample 1 0
    advantage = 1 / (1 / math.sqrt(2) + algorithms.GROUP_STD_EPS) / 2
    assert value.item() == pytest.approx(-advantage * 2 * 3 / 5, rel=1e-5)
    assert torch.all(logprobs.grad[1] == 0) and torch.all(logprobs.grad[0] < 0)
    assert metrics["tis_masked_frac"] == metrics["tis_outside_frac"] == pytest.approx(2 / 5)
    assert "tis_truncated_frac" not in metrics


@pytest.mark.parametrize(("provider", "plugin_name"), [
    ("grpo", "plasmid_grpo.plugin"), ("gspo", "plasmid_grpo.plugin"), ("ppo", "plasmid_ppo.plugin"),
    ("reinforce++", "plasmid_reinforce_pp.plugin"),
])
def test_every_loss_with_old_logprobs_accepts_the_levels(provider, plugin_name):
    loss = loss_of(provider, plugin_name, tis=True, tis_mode="geometric", tis_clip=1.5)
    assert loss.needs_old_logprobs
    assert (loss.rollout_correction, loss.tis_level, loss.tis_band) == ("truncate", "geometric", (0.0, 1.5))


def test_a_level_without_a_correction_is_a_one_line_usage_error():
    plugin = pytest.importorskip("plasmid_grpo.plugin")
    with pytest.raises(UsageError, match="--tis-mode sequence .* add --tis .* or --icepop") as raised:
        testing.make_config(plugin, tis_mode="sequence")
    assert "\n" not in str(raised.value)
