"""What the torch trainer computes: log-probs, the update, its metrics, resuming, the LR schedule."""

from __future__ import annotations

import math
from dataclasses import replace

import plasmid_grpo.plugin
import plasmid_torchtrain.plugin
import pytest
import torch
from plasmid_torchtrain import schedule, weights

from plasmid import testing
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch

VOCAB = 16


@pytest.fixture
def make_trainer(model_dir, tmp_path):
    def factory(**options):
        options = {"lr": 1e-3, "model": str(model_dir), "run_dir": tmp_path / "run", **options}
        config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, **options)
        loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
        return testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))

    return factory


def with_rollout_logprobs(trainer, batch, temperature=1.0):
    values = testing.run(trainer.logprobs(batch.samples, temperature))
    for sample, logprobs in zip(batch.samples, values, strict=True):
        sample.rollout_logprobs = logprobs
    return batch


def test_logprobs_equal_an_unpadded_forward_of_each_sample(make_trainer, model_dir):
    trainer = make_trainer()
    samples = make_rollout_batch(VOCAB).samples
    reference = load_causal_lm(str(model_dir))
    values = testing.run(trainer.logprobs(samples, 0.7))
    for sample, got in zip(samples, values, strict=True):
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([sample.tokens])).logits[0].float() / 0.7
        logprobs = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(sample.tokens[1:]).unsqueeze(-1))
        expected = logprobs.squeeze(-1)[-sample.response_length:]
        assert torch.allclose(torch.tensor(got), expected, atol=1e-5)


def test_first_update_starts_at_ratio_one(make_trainer):
    metrics = testing.run(make_trainer().train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/clip_frac"] == 0.0
    assert metrics["train/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["train/grad_norm"] > 0 and metrics["train/lr"] == 1e-3
    assert metrics["train/updates"] == 1.0 and metrics["train/samples"] == 8.0
    assert "train/kl" not in metrics          # no reference model without a KL term


def test_reported_tokens_count_only_trained_tokens(make_trainer):
    batch = make_rollout_batch(VOCAB)
    metrics = testing.run(make_trainer().train_step(batch))
    assert metrics["train/tokens"] == sum(sum(s.loss_mask) for s in batch.samples)
    assert metrics["train/tokens"] < sum(s.response_length for s in batch.samples)


def test_rollout_logprob_diff_is_zero_for_the_trainers_own_logprobs(make_trainer):
    trainer = make_trainer()
    batch = with_rollout_logprobs(trainer, make_rollout_batch(VOCAB), temperature=1.0)
    assert testing.run(trainer.train_step(batch))["train/train_rollout_logprob_abs_diff"] < 1e-5


def test_rollout_logprob_diff_measures_the_engine_mismatch_on_trained_tokens(make_trainer):
    trainer = make_trainer()
    batch = with_rollout_logprobs(trainer, make_rollout_batch(VOCAB))
    for sample in batch.samples:
        sample.rollout_logprobs = [value - (0.5 if keep else 100.0)   # masked tokens must not count
                                   for value, keep in zip(sample.rollout_logprobs, sample.loss_mask, strict=True)]
    batch.samples[0].rollout_logprobs = None                          # skipped
    metrics = testing.run(trainer.train_step(batch))
    assert metrics["train/train_rollout_logprob_abs_diff"] == pytest.approx(0.5, abs=1e-5)


def test_micro_batches_accumulate_to_the_full_batch_update(make_trainer):
    """The summed gradient equals the whole batch's to float rounding. The weights get a tenth of
    the step as tolerance: Adam's first update moves each weight by about lr * sign(grad), so the
    rounding of a near-zero gradient can move a weight differently by up to lr (1e-3)."""
    whole, split = make_trainer(micro_batch_size=256), make_trainer(micro_batch_size=3)
    metrics_whole = testing.run(whole.train_step(make_rollout_batch(VOCAB)))
    metrics_split = testing.run(split.train_step(make_rollout_batch(VOCAB)))
    for name in ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm"):
        assert metrics_split[name] == pytest.approx(metrics_whole[name], rel=1e-4, abs=1e-6), name
    gradients = {name: p.grad for name, p in split.model.named_parameters()}
    for name, parameter in whole.model.named_parameters():
        assert torch.allclose(parameter.grad, gradients[name], rtol=1e-4, atol=1e-7), name
    a, b = exported(whole), exported(split)
    for name in a:
        assert torch.allclose(torch.from_numpy(a[name]), torch.from_numpy(b[name]), atol=1e-4), name


def test_global_batch_size_makes_one_update_per_chunk(make_trainer):
    trainer = make_trainer(global_batch_size=4, prompts_per_step=2, n_samples_per_prompt=4)
    metrics = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    assert metrics["train/updates"] == 2.0 and trainer.updates == 2
    # the second update starts from new weights: its ratio is no longer 1 everywhere
    assert metrics["train/approx_kl"] > 0


def test_kl_loss_builds_a_frozen_reference_and_reports_kl(make_trainer):
    trainer = make_trainer(kl_loss_coef=0.1)
    assert trainer.ref_model is not None
    before = exported(trainer)
    first = testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    second = testing.run(trainer.train_step(make_rollout_batch(VOCAB, seed=3)))
    assert first["train/kl"] == pytest.approx(0.0, abs=1e-7)     # policy == reference at the start
    assert second["train/kl"] > 0
    reference = dict(weights.hf_named_tensors(trainer.ref_model))
    assert all(torch.equal(reference[name], torch.from_numpy(before[name])) for name in before)


def test_training_resumes_bit_identically_from_a_checkpoint(make_trainer, tmp_path):
    batches = [make_rollout_batch(VOCAB, seed=seed, rollout_id=seed) for seed in range(4)]
    options = dict(lr_schedule="cosine", lr_warmup_steps=1, num_rollouts=4, weight_decay=0.1)
    straight = make_trainer(**options)
    for batch in batches[:2]:
        testing.run(straight.train_step(batch))
    testing.run(straight.save(str(tmp_path / "ckpt")))
    for batch in batches[2:]:
        testing.run(straight.train_step(batch))

    resumed = make_trainer(**options)
    testing.run(resumed.load(str(tmp_path / "ckpt")))
    assert resumed.steps == 2 and resumed.updates == 2
    for batch in batches[2:]:
        testing.run(resumed.train_step(batch))
    a, b = exported(straight), exported(resumed)
    assert all((a[name] == b[name]).all() for name in a)


def test_load_restores_random_generator_states(make_trainer, tmp_path):
    import random

    trainer = make_trainer()
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    expected = (torch.rand(3), random.random())
    testing.run(trainer.load(str(tmp_path / "ckpt")))
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_checkpoint_is_a_complete_hugging_face_directory(make_trainer, tmp_path):
    trainer = make_trainer()
    testing.run(trainer.save(str(tmp_path / "ckpt")))
    files = {p.name for p in (tmp_path / "ckpt" / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert (tmp_path / "ckpt" / "trainer_state.pt").is_file()
    assert not (tmp_path / "ckpt.tmp").exists()


def test_tied_lm_head_is_exported_once(make_trainer):
    names = set(exported(make_trainer()))
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_a_sample_without_reward_is_an_error_that_names_it(make_trainer):
    batch = make_rollout_batch(VOCAB)
    batch.groups[1].samples[2].reward = None
    with pytest.raises(ValueError, match=r"sample 6 \(index 6, group 1\) has reward None"):
        testing.run(make_trainer().train_step(batch))


def test_a_loss_mask_of_the_wrong_length_is_an_error(make_trainer):
    batch = make_rollout_batch(VOCAB)
    batch.samples[0].loss_mask = [1]
    with pytest.raises(ValueError, match="loss_mask has 1 entries"):
        testing.run(make_trainer().train_step(batch))


# ------------------------------------------------------------------------------------------------
# learning-rate schedule and buckets
# ------------------------------------------------------------------------------------------------


def test_warmup_is_linear_up_to_the_peak():
    rates = [schedule.learning_rate(u, lr=1.0, schedule="constant", warmup_steps=4, total_steps=10)
             for u in range(6)]
    assert rates == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_and_cosine_decay_reach_min_lr_at_the_end():
    def rate(kind, update):
        return schedule.learning_rate(update, lr=1.0, schedule=kind, warmup_steps=2, total_steps=6, min_lr=0.2)

    # after 2 warmup updates, progress = (u - 2) / 4
    assert [rate("linear", u) for u in (2, 4, 6, 9)] == pytest.approx([1.0, 0.6, 0.2, 0.2])
    assert [rate("cosine", u) for u in (2, 3, 4, 6)] == pytest.approx(
        [1.0, 0.2 + 0.8 * (1 + math.cos(math.pi / 4)) / 2, 0.6, 0.2])


def test_trainer_follows_the_schedule_over_updates(make_trainer):
    trainer = make_trainer(lr_schedule="linear", lr_warmup_steps=0, num_rollouts=2, global_batch_size=4,
                           prompts_per_step=2, n_samples_per_prompt=4, min_lr=0.0)
    testing.run(trainer.train_step(make_rollout_batch(VOCAB)))
    # 4 updates in all; after 2 the rate is halfway down
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-3)


def test_buckets_hold_at_most_the_bound_and_big_tensors_alone():
    named = [(name, torch.zeros(n)) for name, n in [("a", 2), ("b", 2), ("c", 10), ("d", 1), ("e", 3)]]
    grouped = [[name for name, _ in bucket] for bucket in weights.buckets(named, bucket_bytes=16)]
    assert grouped == [["a", "b"], ["c"], ["d", "e"]]
    first = next(iter(weights.buckets(named, bucket_bytes=16)))
    assert first[0][1].data_ptr() != named[0][1].data_ptr()          # copies, not the live tensors


def test_buckets_refuse_a_non_positive_bound():
    with pytest.raises(ValueError, match="--update-weight-buffer-size"):
        next(weights.buckets([("a", torch.zeros(1))], 0))


def test_empty_batch_makes_no_update(make_trainer):
    trainer = make_trainer()
    metrics = testing.run(trainer.train_step(replace(make_rollout_batch(VOCAB), groups=[])))
    assert metrics["train/samples"] == 0.0 and trainer.updates == 0
