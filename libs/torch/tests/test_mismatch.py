"""Train/rollout mismatch metrics (plasmid_torch.mismatch): hand-computed values, and an on-policy
step with torchgen sampling and torchtrain training (ppo_kl is 0, the log-prob diff float rounding)."""

from __future__ import annotations

import math

import pytest
import torch

from plasmid import testing
from plasmid.types import Group, LossBatch, RolloutBatch, Sample, SamplingParams
from plasmid_torch.mismatch import policy_kl, step_mismatch_metrics
from plasmid_torch.tiny import BOS_ID, build_tiny_model


def test_step_metrics_are_hand_computed_over_trained_tokens_only():
    # ratios exp(trainer - engine): 2, 1/2 on trained tokens; the masked token's 100 never counts
    trainer = torch.tensor([[math.log(2.0), 0.0], [0.0, math.log(100.0)]])
    engine = torch.tensor([[0.0, 0.0], [math.log(2.0), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    metrics = step_mismatch_metrics(trainer, engine, mask)
    ln2 = math.log(2.0)
    assert metrics["logprob_abs_diff_mean"] == pytest.approx(2 * ln2 / 3, rel=1e-6)
    assert metrics["mismatch_abs_diff"] == metrics["logprob_abs_diff_mean"]
    assert metrics["token_prob_ratio_max"] == pytest.approx(2.0, rel=1e-6)
    assert metrics["mismatch_ratio_mean"] == pytest.approx((2 + 1 + 0.5) / 3, rel=1e-6)
    # k3 of KL(engine || trainer) per token, d = engine - trainer: exp(-d) - 1 + d
    expected = ((2 - 1 - ln2) + 0 + (0.5 - 1 + ln2)) / 3
    assert metrics["mismatch_kl"] == pytest.approx(expected, rel=1e-5)
    assert step_mismatch_metrics(trainer, engine, torch.zeros(2, 2)) == {}


def test_policy_kl_is_normalised_by_the_steps_tokens_and_zero_at_equal_logprobs():
    old = torch.tensor([[0.0, -1.0, -2.0]])
    batch = LossBatch(rewards=torch.zeros(1), group_index=torch.zeros(1, dtype=torch.long),
                      response_mask=torch.tensor([[1.0, 1.0, 0.0]]), old_logprobs=old, total_tokens=4,
                      total_samples=2)
    assert policy_kl(batch, old.clone()) == 0.0
    current = old + torch.tensor([[ln := math.log(2.0), 0.0, 5.0]])
    # k3 of KL(old || current) at the first token: exp(ln 2) - 1 - ln 2; the masked one never counts
    assert policy_kl(batch, current) == pytest.approx((1 - ln) / 4, rel=1e-5)


@pytest.mark.timeout(120)
def test_an_on_policy_torchgen_torchtrain_step_has_zero_ppo_kl(tmp_path):
    plasmid_grpo = pytest.importorskip("plasmid_grpo.plugin")
    torchgen = pytest.importorskip("plasmid_torchgen.plugin")
    torchtrain = pytest.importorskip("plasmid_torchtrain.plugin")
    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny", seed=0)
    config = testing.make_config(torchtrain, torchgen, plasmid_grpo, run_dir=tmp_path / "run", model=str(model_dir),
                                 lr=1e-3, micro_batch_size=3)
    engine = testing.build("engine", "torchgen", torchgen, config=config)
    loss = testing.build("loss", "grpo", plasmid_grpo, config=config)
    trainer = testing.build("trainer", "torchtrain", torchtrain, config=config, args=(loss,))
    groups = []
    try:
        for group_index, prompt in enumerate([[BOS_ID, 4, 5], [BOS_ID, 7, 8, 9]]):
            samples = []
            for n in range(4):
                output = testing.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=6,
                                                                            seed=10 * group_index + n)))
                samples.append(Sample(tokens=prompt + output.token_ids, response_length=len(output.token_ids),
                                      rollout_logprobs=output.logprobs, reward=float(n % 2), status=output.status,
                                      index=4 * group_index + n, group_index=group_index, weight_version=0))
            groups.append(Group(samples=samples, index=group_index))
    finally:
        testing.run(engine.shutdown())
    metrics = testing.run(trainer.train_step(RolloutBatch(rollout_id=0, groups=groups)))
    assert metrics["train/ppo_kl"] == 0.0
    assert metrics["train/logprob_abs_diff_mean"] <= 1e-5
    assert metrics["train/mismatch_kl"] <= 1e-8
    assert metrics["train/token_prob_ratio_max"] == pytest.approx(1.0, abs=1e-4)
