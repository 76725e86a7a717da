"""--loss sft-mix: every --sft-mix-every-th step an SFT step, the others steps of --sft-mix-loss,
each exactly that loss's (samples, flags, advantages, loss and gradient) on a fixed batch."""

from __future__ import annotations

import subprocess
import sys

import plasmid_grpo.plugin
import plasmid_ppo.plugin
import plasmid_sft.plugin
import pytest
import torch
from plasmid_sft.generate import SFT_TARGET_KEY
from plasmid_sft.mixed import SFTMixLoss

from plasmid import testing
from plasmid.errors import UsageError
from plasmid.types import LossBatch, Sample, Status

PLUGINS = (plasmid_sft.plugin, plasmid_grpo.plugin, plasmid_ppo.plugin)


def make_config(**options):
    return testing.make_config(*PLUGINS, loss="sft-mix", **options)


def make_loss(**options) -> SFTMixLoss:
    return SFTMixLoss(make_config(**options), testing.make_registry(*PLUGINS))


def samples() -> list[Sample]:
    return [Sample(tokens=[1, 2, 3, 7, 8], response_length=2, loss_mask=[1, 1], rollout_logprobs=[-1.0, -2.0],
                   reward=reward, status=Status.COMPLETED, metadata={SFT_TARGET_KEY: [4, 5, 6]}, index=index,
                   group_index=0)
            for index, reward in enumerate((1.0, 0.0, 0.0))]


def loss_batch(trained: list[Sample]) -> tuple[LossBatch, torch.Tensor]:
    """The LossBatch of ``trained`` (old log-probs: the rollout's, or -1.5) and fixed policy log-probs."""
    width = max(sample.response_length for sample in trained)
    mask = torch.zeros(len(trained), width)
    old = torch.full((len(trained), width), -1.5)
    for row, sample in enumerate(trained):
        mask[row, :sample.response_length] = 1.0
        if sample.rollout_logprobs is not None:
            old[row, :sample.response_length] = torch.tensor(sample.rollout_logprobs)
    batch = LossBatch(rewards=torch.tensor([sample.reward for sample in trained]),
                      group_index=torch.zeros(len(trained), dtype=torch.long), response_mask=mask, old_logprobs=old,
                      total_tokens=int(mask.sum()), total_samples=len(trained))
    logprobs = old + torch.linspace(-0.3, 0.3, old.numel()).view_as(old)
    return batch, logprobs


def loss_and_grad(loss, trained: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    batch, logprobs = loss_batch(trained)
    batch.advantages, batch.returns = loss.advantages(batch)
    logprobs.requires_grad_(True)
    value, metrics = loss.policy_loss(batch, logprobs, None)
    value.backward()
    return value.detach(), logprobs.grad, metrics


def test_every_nth_step_is_an_sft_step_and_the_others_are_steps_of_the_rl_loss():
    mixed = make_loss(sft_mix_every=3)
    sft = testing.build("loss", "sft", plasmid_sft.plugin, config=make_config())
    grpo = testing.build("loss", "grpo", plasmid_grpo.plugin, config=make_config())
    kinds = []
    for rollout_id in range(6):
        trained = mixed.training_samples(samples(), rollout_id=rollout_id)
        kinds.append("sft" if mixed.sft_step else "rl")
        own = sft if mixed.sft_step else grpo
        expected = own.training_samples(samples()) if own is sft else samples()
        assert trained == expected
        assert mixed.needs_old_logprobs == own.needs_old_logprobs
        assert mixed.reference_logprobs_key is None and mixed.needs_ref == grpo.needs_ref
        value, grad, metrics = loss_and_grad(mixed, trained)
        own_value, own_grad, own_metrics = loss_and_grad(own, trained)
        assert torch.equal(value, own_value) and torch.equal(grad, own_grad)
        assert metrics == {**own_metrics, "sft_step": 1.0 if own is sft else 0.0}
    assert kinds == ["rl", "rl", "sft", "rl", "rl", "sft"]


def test_the_kind_of_a_step_follows_its_rollout_id_so_a_resumed_run_keeps_the_schedule():
    fresh, resumed = make_loss(sft_mix_every=3), make_loss(sft_mix_every=3)
    for rollout_id in range(9):
        fresh.training_samples(samples(), rollout_id=rollout_id)
        if rollout_id >= 4:                                          # resumed after rollout 3's checkpoint
            resumed.training_samples(samples(), rollout_id=rollout_id)
            assert resumed.sft_step == fresh.sft_step == (rollout_id in (5, 8))


def test_the_sft_step_trains_on_the_demonstrations_and_the_rl_step_on_the_rewarded_samples():
    mixed = make_loss()                                              # alternate: RL, SFT, ...
    rl_samples = mixed.training_samples(samples(), rollout_id=0)
    _, rl_grad, _ = loss_and_grad(mixed, rl_samples)
    assert [s.tokens for s in rl_samples] == [[1, 2, 3, 7, 8]] * 3
    assert rl_grad[0].sum() < 0 < rl_grad[1].sum()                   # reward 1 pulled up, reward 0 pushed down
    demonstrations = mixed.training_samples(samples(), rollout_id=1)
    assert [s.tokens for s in demonstrations] == [[1, 2, 3, 4, 5, 6]] * 3
    _, sft_grad, metrics = loss_and_grad(mixed, demonstrations)
    assert torch.allclose(sft_grad, torch.full_like(sft_grad, -1 / 9)) and metrics["sft_step"] == 1.0


@pytest.mark.parametrize(("name", "message"), [
    ("sft", "give the RL loss to mix SFT steps with"),
    ("ppo", "--sft-mix-loss ppo needs a critic"),
])
def test_a_loss_that_cannot_be_mixed_is_a_usage_error(name, message):
    with pytest.raises(UsageError, match=message):
        make_loss(sft_mix_loss=name)


def test_loss_sft_mix_defaults_generate_to_sft_and_every_to_alternation():
    config = make_config()
    assert (config.option.generate, config.option.sft_mix_loss, config.option.sft_mix_every) == ("sft", "grpo", 2)
    with pytest.raises(UsageError, match="--sft-mix-every 1: must be >= 2"):
        make_config(sft_mix_every=1)


def test_an_unknown_sft_mix_loss_is_one_line_naming_its_flag_and_nothing_is_written(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--loss", "sft-mix",
                           "--sft-mix-loss", "grpp", "--num-rollouts", "1", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: error:")]
    assert len(error) == 1 and "unknown loss 'grpp' (--sft-mix-loss); did you mean 'grpo'" in error[0]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
