"""An exactly on-policy step (one optimizer update, no critic, advantages without old log-probs)
takes its old log-probs from the update's own forward passes instead of a no-grad pass of their
own (:meth:`plasmid_torch.train_step.TrainStep.reuses_update_forward`): one forward pass per
micro-batch fewer, and every metric and weight equal, bit for bit, to the step with the extra pass."""

from __future__ import annotations

from dataclasses import replace

import plasmid_grpo.plugin
import plasmid_torchtrain.plugin
import pytest
import torch

from plasmid import testing
from plasmid_torch.testing.contracts.trainer import make_rollout_batch

VOCAB = 16


@pytest.fixture
def make_trainer(model_dir, tmp_path):
    def factory(*, reuse: bool = True, share_prompts: bool = False, pack: bool = False, **options):
        options = {"lr": 1e-2, "model": str(model_dir), "run_dir": tmp_path / "run", "micro_batch_size": 3,
                   "torchtrain_packing": pack, **options}
        config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, **options)
        loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
        trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
        if not reuse:   # the separate no-grad pass, as before
            trainer.recipe.parts = replace(trainer.recipe.parts, fills_old_logprobs=False)
        # a pass is one forward call, or two where a micro-batch's samples share a prompt
        trainer.share_prompts = share_prompts
        trainer.forwards = 0

        def count(module, args, kwargs):
            trainer.forwards += 1

        trainer.model.register_forward_pre_hook(count, with_kwargs=True)
        return trainer

    return factory


def batch_with_engine_logprobs(trainer, step: int):
    """The contract's batch with rewards varied by ``step`` and the trainer's current log-probs
    as the engine's (so the train/rollout mismatch metrics are computed)."""
    batch = make_rollout_batch(VOCAB)
    for position, sample in enumerate(batch.samples):
        sample.reward = float((position * 7 + step * 3) % 5)
    values = testing.run(trainer.logprobs(batch.samples, 1.0))
    for sample, logprobs in zip(batch.samples, values, strict=True):
        sample.rollout_logprobs = [value + 1e-3 * (index % 3) for index, value in enumerate(logprobs)]
    return batch


def train(trainer, steps: int = 3) -> list[dict[str, float]]:
    out = []
    for step in range(steps):
        batch = batch_with_engine_logprobs(trainer, step)
        trainer.forwards = 0
        metrics = testing.run(trainer.train_step(batch))
        out.append({**{k: v for k, v in metrics.items() if "seconds" not in k}, "forwards": trainer.forwards})
    return out


@pytest.mark.parametrize(("share_prompts", "pack"), [(False, False), (True, False), (False, True)],
                         ids=["one-pass", "shared-prompts", "packed"])
def test_on_policy_steps_reuse_the_update_forward_with_identical_metrics_and_weights(make_trainer, share_prompts,
                                                                                     pack):
    reusing = make_trainer(share_prompts=share_prompts, pack=pack)
    separate = make_trainer(reuse=False, share_prompts=share_prompts, pack=pack)
    assert reusing.recipe.reuses_update_forward(1) and not separate.recipe.reuses_update_forward(1)
    got, want = train(reusing), train(separate)
    # 8 samples (2 prompts x 4) in micro-batches of 3: 3 passes per update, 3 more for a separate
    # old pass; with shared prompts each micro-batch has two samples of one prompt: 2 calls a pass;
    # packed, one call a pass
    calls = 2 if share_prompts else 1
    assert [m.pop("forwards") for m in got] == [3 * calls] * 3
    assert [m.pop("forwards") for m in want] == [6 * calls] * 3
    assert got == want
    assert "train/mismatch_kl" in got[0] and got[0]["train/logprob_abs_diff_mean"] > 0
    assert got[0]["train/ppo_kl"] == 0.0 and got[0]["train/clip_frac"] == 0.0
    for (name, a), (_, b) in zip(reusing.model.named_parameters(), separate.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("options", "updates", "forwards"), [
    ({"global_batch_size": 4}, 2, 3 + 2 + 2),   # the old pass, then two updates of 4 (micro-batches 3 + 1)
    ({"kl_coef": 0.1}, 1, 3 + 3),               # the old pass, then the update (the reference is another module)
], ids=["two-updates-per-step", "kl-reward-penalty"])
def test_steps_that_need_old_logprobs_first_keep_the_separate_pass(make_trainer, options, updates, forwards):
    trainer = make_trainer(**options)
    assert not trainer.recipe.reuses_update_forward(updates)
    metrics = train(trainer, steps=1)[0]
    assert metrics["forwards"] == forwards
    assert metrics["train/updates"] == float(updates)
