"""The GRPO variants and the shared options, against values worked out by hand.

The batch is that of test_grpo_loss.py: two groups of two, rewards [1, 0 | 0, 0], response
mask (T = 3) and ratios to the old policy (old log-probs ln 1/2)::

    sample 0: 1 1 0    ratio 1.5 1.0        (group 0, reward 1)
    sample 1: 1 1 1    ratio 0.5 1.0 1.0    (group 0, reward 0)
    sample 2: 1 0 0                         (group 1, reward 0)
    sample 3: 1 1 0                         (group 1, reward 0)

8 trained tokens, 4 samples. GRPO's advantage of group 0 is +-a, a = 0.5 / (sqrt(0.5) + eps).
"""

from __future__ import annotations

import math
import statistics

import plasmid_grpo.loss
import plasmid_grpo.plugin
import pytest
import torch

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import LossBatch
from plasmid_torch.algorithms import GROUP_STD_EPS, WHITEN_EPS

A = 0.5 / (math.sqrt(0.5) + GROUP_STD_EPS)
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
RATIOS = [[1.5, 1.0, 1.0], [0.5, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
OLD = math.log(0.5)
PROVIDERS = ("grpo", "dr-grpo", "dapo", "gspo", "cispo", "rloo")


def make_loss(provider: str = "grpo", **options):
    config = testing.make_config(plasmid_grpo.plugin, **options)
    return testing.build("loss", provider, plasmid_grpo.plugin, config=config)


def make_batch(loss, **fields) -> LossBatch:
    batch = LossBatch(rewards=torch.tensor([1.0, 0.0, 0.0, 0.0]), group_index=torch.tensor([0, 0, 1, 1]),
                      response_mask=torch.tensor(MASK), old_logprobs=torch.full((4, 3), OLD),
                      total_tokens=8, total_samples=4, **fields)
    batch.advantages, batch.returns = loss.advantages(batch)
    return batch


def current_logprobs(ratios=RATIOS) -> torch.Tensor:
    return (OLD + torch.log(torch.tensor(ratios))).requires_grad_(True)


def per_sample(values) -> torch.Tensor:
    """[B] advantages broadcast over MASK."""
    return torch.tensor(values).unsqueeze(-1) * torch.tensor(MASK)


def test_every_variant_is_registered():
    registry = testing.make_registry(plasmid_grpo.plugin)
    for provider in PROVIDERS:
        assert registry.get("loss", provider) is not None


# ------------------------------------------------------------------------------------------------
# dr-grpo
# ------------------------------------------------------------------------------------------------


def test_dr_grpo_advantages_are_not_divided_by_the_std():
    batch = make_batch(make_loss("dr-grpo"))
    assert torch.allclose(batch.advantages, per_sample([0.5, -0.5, 0.0, 0.0]))


def test_dr_grpo_divides_each_sequence_sum_by_max_new_tokens():
    loss = make_loss("dr-grpo", max_new_tokens=4)
    assert loss.loss_agg == "seq-mean-token-sum-norm"
    batch = make_batch(loss)
    value, _ = loss.policy_loss(batch, current_logprobs(), None)
    # sample 0 (A = 0.5): max(-0.75, -0.6) = -0.6 (clipped), -0.5;  sample 1 (A = -0.5): 0.4 (clipped), 0.5, 0.5
    expected = ((-0.6 - 0.5) / 4 + (0.4 + 0.5 + 0.5) / 4) / 4
    assert value.item() == pytest.approx(expected, rel=1e-5)


def test_grpo_without_std_normalization_equals_dr_grpo_advantages():
    batch = make_batch(make_loss("grpo", disable_std_normalization=True))
    assert torch.allclose(batch.advantages, per_sample([0.5, -0.5, 0.0, 0.0]))


# ------------------------------------------------------------------------------------------------
# dapo
# ------------------------------------------------------------------------------------------------


def test_dapo_clips_higher_by_default_and_aggregates_per_token():
    loss = make_loss("dapo")
    assert loss.eps_clip_high == 0.28 and loss.loss_agg == "token-mean"
    batch = make_batch(loss)
    value, metrics = loss.policy_loss(batch, current_logprobs(), None)
    # ratio 1.5 with A = +a is clipped at 1.28 (not 1.2); ratio 0.5 with A = -a at 0.8
    assert value.item() == pytest.approx((-1.28 * A - A + 0.8 * A + A + A) / 8, rel=1e-5)
    assert metrics["clip_frac"] == pytest.approx(2 / 8)
    assert make_loss("dapo", eps_clip_high=0.4).eps_clip_high == 0.4


def test_dapo_overlong_penalty_shapes_rewards_before_normalising():
    # limit 3, buffer 2: penalty -(l - 1) / 2 for l > 1; lengths 2, 3, 1, 2 -> -0.5, -1, 0, -0.5
    loss = make_loss("dapo", max_new_tokens=3, overlong_buffer_len=2)
    batch = make_batch(loss)
    # shaped rewards [0.5, -1 | 0, -0.5]: each group is +-d around its mean with std d * sqrt(2)
    advantage = 0.75 / (0.75 * math.sqrt(2) + GROUP_STD_EPS)
    advantage_1 = 0.25 / (0.25 * math.sqrt(2) + GROUP_STD_EPS)
    assert torch.allclose(batch.advantages, per_sample([advantage, -advantage, advantage_1, -advantage_1]), atol=1e-5)


def test_dapo_overlong_buffer_defaults_to_a_fifth_of_the_length_limit():
    assert make_loss("dapo", max_new_tokens=20).overlong_buffer_length == 4
    assert make_loss("dapo", max_new_tokens=20, overlong_buffer_len=0).overlong_buffer_length == 0
    assert make_loss("grpo", max_new_tokens=20).overlong_buffer_length == 0


def test_overlong_buffer_longer_than_the_limit_is_a_usage_error_naming_both_flags():
    with pytest.raises(UsageError, match="--overlong-buffer-len 5 is longer than --max-new-tokens 4"):
        make_loss("grpo", max_new_tokens=4, overlong_buffer_len=5)
    with pytest.raises(UsageError, match="--overlong-buffer-len 5 is longer than --max-new-tokens 4"):
        make_loss("dapo", max_new_tokens=4, overlong_buffer_len=5)


# ------------------------------------------------------------------------------------------------
# gspo
# ------------------------------------------------------------------------------------------------


def test_gspo_clips_whole_sequences_on_their_geometric_mean_ratio():
    loss = make_loss("gspo", eps_clip=0.2)
    assert loss.loss_agg == "seq-mean-token-mean"
    batch = make_batch(loss)
    value, metrics = loss.policy_loss(batch, current_logprobs(), None)
    # s_0 = sqrt(1.5) = 1.225 > 1.2 (A = +a): -1.2a;  s_1 = 0.5^(1/3) = 0.794 < 0.8 (A = -a): 0.8a
    assert value.item() == pytest.approx((-1.2 * A + 0.8 * A) / 4, rel=1e-5)
    assert metrics["clip_frac"] == pytest.approx(5 / 8)     # both sequences, all their tokens


def test_gspo_gradient_is_that_of_the_sequence_ratio():
    loss = make_loss("gspo", eps_clip=0.3)
    batch = make_batch(loss)
    logprobs = current_logprobs()
    value, metrics = loss.policy_loss(batch, logprobs, None)
    s0, s1 = math.sqrt(1.5), 0.5 ** (1 / 3)                 # both inside [0.7, 1.3]
    assert value.item() == pytest.approx((-A * s0 + A * s1) / 4, rel=1e-5)
    assert metrics["clip_frac"] == 0.0
    value.backward()
    # d(-A s_i)/d logprob_t = -A s_i / |y_i|, over 4 samples
    expected = torch.tensor([[-A * s0 / 2] * 2 + [0.0], [A * s1 / 3] * 3, [0.0] * 3, [0.0] * 3]) / 4
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# cispo
# ------------------------------------------------------------------------------------------------


def test_cispo_keeps_the_gradient_of_clipped_tokens_scaled_by_the_clipped_weight():
    loss = make_loss("cispo", eps_clip=0.2)
    batch = make_batch(loss)
    logprobs = current_logprobs()
    value, metrics = loss.policy_loss(batch, logprobs, None)
    # loss = -w A log p: weights 1.2 (ratio 1.5), 0.8 (ratio 0.5), 1 elsewhere; log p = ln(0.5 * ratio)
    ln = math.log
    expected = (-1.2 * A * ln(0.75) - A * ln(0.5) + 0.8 * A * ln(0.25) + 2 * A * ln(0.5)) / 8
    assert value.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["clip_frac"] == pytest.approx(2 / 8)
    value.backward()
    expected_grad = torch.tensor([[-1.2 * A, -A, 0], [0.8 * A, A, A], [0, 0, 0], [0, 0, 0]]) / 8
    assert torch.allclose(logprobs.grad, expected_grad, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# rloo
# ------------------------------------------------------------------------------------------------


def test_rloo_advantage_is_the_reward_less_the_others_mean():
    loss = make_loss("rloo")
    batch = make_batch(loss)
    assert torch.allclose(batch.advantages, per_sample([1.0, -1.0, 0.0, 0.0]))
    value, _ = loss.policy_loss(batch, current_logprobs(), None)
    assert value.item() == pytest.approx((-1.2 - 1.0 + 0.8 + 1.0 + 1.0) / 8, rel=1e-5)


def test_rloo_with_three_samples():
    loss = make_loss("rloo")
    batch = LossBatch(rewards=torch.tensor([3.0, 0.0, 0.0]), group_index=torch.zeros(3, dtype=torch.long),
                      response_mask=torch.ones(3, 1), old_logprobs=torch.zeros(3, 1), total_tokens=3, total_samples=3)
    advantages, _ = loss.advantages(batch)
    assert torch.allclose(advantages.squeeze(-1), torch.tensor([3.0, -1.5, -1.5]))


# ------------------------------------------------------------------------------------------------
# shared options: whitening, TIS, IcePop, mismatch metrics
# ------------------------------------------------------------------------------------------------


def test_advantage_whitening_spans_the_whole_batch():
    batch = make_batch(make_loss("grpo", advantage_whiten=True))
    trained = [A, A, -A, -A, -A, 0.0, 0.0, 0.0]          # the GRPO advantages of the 8 trained tokens
    mean, std = statistics.mean(trained), statistics.stdev(trained)
    scale = std / math.sqrt(std**2 + WHITEN_EPS)
    expected = torch.tensor([[A, A, 0], [-A, -A, -A], [0, 0, 0], [0, 0, 0]]) - mean
    expected = expected * torch.tensor(MASK) / std * scale
    assert torch.allclose(batch.advantages, expected, atol=1e-5)


def rollout_for(weights) -> torch.Tensor:
    """Engine log-probs such that exp(old - rollout) equals ``weights``."""
    return OLD - torch.log(torch.tensor(weights))


ENGINE_WEIGHTS = [[3.0, 1.0, 1.0], [0.25, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def test_tis_multiplies_the_policy_loss_by_the_truncated_weight():
    loss = make_loss("grpo", tis=True)                      # band [0, 2]
    batch = make_batch(loss, rollout_logprobs=rollout_for(ENGINE_WEIGHTS))
    value, metrics = loss.policy_loss(batch, current_logprobs(), None)
    # per-token losses -1.2a, -a | 0.8a, a, a  with weights 2 (3 truncated), 1 | 0.25, 1, 1
    assert value.item() == pytest.approx((-1.2 * A * 2 - A + 0.8 * A * 0.25 + A + A) / 8, rel=1e-5)
    assert metrics["tis_weight_mean"] == pytest.approx((2 + 1 + 0.25 + 1 + 1 + 1 + 1 + 1) / 8)
    assert metrics["tis_outside_frac"] == pytest.approx(1 / 8)


def test_icepop_drops_tokens_outside_the_band():
    loss = make_loss("grpo", icepop=True)                   # band [0.5, 5]
    batch = make_batch(loss, rollout_logprobs=rollout_for(ENGINE_WEIGHTS))
    value, metrics = loss.policy_loss(batch, current_logprobs(), None)
    # weight 3 kept (inside), 0.25 dropped
    assert value.item() == pytest.approx((-1.2 * A * 3 - A + 0 + A + A) / 8, rel=1e-5)
    assert metrics["tis_weight_mean"] == pytest.approx((3 + 1 + 0 + 1 + 1 + 1 + 1 + 1) / 8)
    assert metrics["tis_outside_frac"] == pytest.approx(1 / 8)


def test_tis_band_follows_the_flags():
    loss = make_loss("grpo", tis=True, tis_clip=1.5, tis_clip_low=0.5)
    batch = make_batch(loss, rollout_logprobs=rollout_for(ENGINE_WEIGHTS))
    _, metrics = loss.policy_loss(batch, current_logprobs(), None)
    assert metrics["tis_weight_mean"] == pytest.approx((1.5 + 1 + 0.5 + 5) / 8)
    assert metrics["tis_outside_frac"] == pytest.approx(2 / 8)


def test_without_correction_the_loss_is_unweighted_and_reports_ppo_kl_not_the_mismatch():
    """The train/rollout mismatch is the recipe's, once per step for every loss
    (plasmid_torch.mismatch, tested in libs/torch/tests/test_mismatch.py), not the loss's."""
    loss = make_loss("grpo")
    batch = make_batch(loss, rollout_logprobs=rollout_for(ENGINE_WEIGHTS))
    value, metrics = loss.policy_loss(batch, current_logprobs(), None)
    assert value.item() == pytest.approx((-1.2 * A - A + 0.8 * A + A + A) / 8, rel=1e-5)   # unweighted
    assert "tis_weight_mean" not in metrics and "mismatch_abs_diff" not in metrics
    assert metrics["ppo_kl"] == metrics["approx_kl"] > 0


def test_the_band_defaults_hold_without_the_kernel_configure_step():
    def built(**options):
        config = testing.make_config(plasmid_grpo.plugin, configure=False, **options)
        return plasmid_grpo.loss.GRPOLoss(config)

    assert (built(icepop=True).rollout_correction, built(icepop=True).tis_band) == ("mask", (0.5, 5.0))
    assert (built(tis=True).rollout_correction, built(tis=True).tis_band) == ("truncate", (0.0, 2.0))
    assert built(tis=True, tis_clip=3.0).tis_band == (0.0, 3.0)
    assert built().rollout_correction is None


def test_tis_without_engine_logprobs_is_an_error_naming_the_flag():
    loss = make_loss("grpo", tis=True)
    with pytest.raises(ValueError, match="--tis"):
        loss.policy_loss(make_batch(loss), current_logprobs(), None)


def test_tis_and_icepop_together_are_a_usage_error():
    with pytest.raises(UsageError, match="--icepop"):
        make_loss("grpo", tis=True, icepop=True)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_masked_tokens_never_contribute(provider):
    loss = make_loss(provider, tis=True)
    batch = make_batch(loss, rollout_logprobs=rollout_for(ENGINE_WEIGHTS))
    logprobs = current_logprobs()
    value, metrics = loss.policy_loss(batch, logprobs, None)
    scrambled = logprobs.detach().clone()
    scrambled[torch.tensor(MASK) == 0] = -1e4                # extreme log-ratios at masked positions
    scrambled.requires_grad_(True)
    batch.old_logprobs = torch.where(torch.tensor(MASK) > 0, batch.old_logprobs, 1e4)
    batch.rollout_logprobs = torch.where(torch.tensor(MASK) > 0, batch.rollout_logprobs, -1e4)
    value_scrambled, metrics_scrambled = loss.policy_loss(batch, scrambled, None)
    value_scrambled.backward()
    assert value_scrambled.item() == pytest.approx(value.item(), rel=1e-6)
    assert metrics_scrambled == pytest.approx(metrics, rel=1e-6)
    assert torch.isfinite(scrambled.grad).all() and torch.all(scrambled.grad[torch.tensor(MASK) == 0] == 0)
