"""The train-step recipe (plasmid_torch.train_step) with stand-in parts, and the optimizer-update helper."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from plasmid.types import Group, LossBatch, RolloutBatch, Sample, Status
from plasmid_torch.optimizer_update import optimizer_update
from plasmid_torch.step_guard import TorchSnapshot
from plasmid_torch.train_step import CriticParts, TrainerParts, TrainStep
from plasmid_torch.trainer_options import TrainerOptions

POLICY, REFERENCE = "policy", "reference"


def batch_of(rewards: list[list[float]], *, rollout_logprobs: bool = False) -> RolloutBatch:
    """A batch with one group per row of ``rewards``; sample ``i`` has ``i % 3 + 1`` response tokens."""
    groups, index = [], 0
    for group_index, row in enumerate(rewards):
        samples = []
        for reward in row:
            length = index % 3 + 1
            samples.append(Sample(prompt="", tokens=[1, 2] + [3] * length, response_length=length, reward=reward,
                                  status=Status.COMPLETED, index=index, group_index=group_index, weight_version=0,
                                  rollout_logprobs=[-0.5] * length if rollout_logprobs else None))
            index += 1
        groups.append(Group(samples=samples, index=group_index))
    return RolloutBatch(rollout_id=0, groups=groups)


class StandInLoss:
    needs_critic = False

    def __init__(self, *, needs_old_logprobs: bool = True, needs_ref: bool = False) -> None:
        self.needs_old_logprobs, self.needs_ref = needs_old_logprobs, needs_ref
        self.seen: LossBatch | None = None

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.seen = batch
        return batch.rewards.unsqueeze(1) * batch.response_mask, None

    def policy_loss(self, batch: LossBatch, logprobs: Any, entropy: Any) -> tuple[Any, dict[str, float]]:
        raise AssertionError("the recipe never calls the loss: the parts do")


class Recorder:
    """Stand-in parts that record every call; log-probs are -1 (policy) or -2 (reference)."""

    def __init__(self, *, critic: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.critic = critic

    def parts(self, loss: Any, *, reference: Any = None) -> TrainerParts:
        critic = CriticParts(values=self.values, update=self.critic_update) if self.critic else None
        return TrainerParts(loss=loss, policy=POLICY, reference=reference, logprobs=self.logprobs,
                            policy_update=self.policy_update, critic=critic, prepare=self.prepare)

    def prepare(self, samples: list[Sample]) -> str:
        self.calls.append(("prepare", len(samples)))
        return "inputs"

    def logprobs(self, model: Any, inputs: Any, temperature: float) -> torch.Tensor:
        self.calls.append(("logprobs", model, inputs, temperature))
        return torch.full((self.size, self.width), -1.0 if model == POLICY else -2.0)

    def values(self, inputs: Any) -> torch.Tensor:
        self.calls.append(("values", inputs))
        return torch.full((self.size, self.width), 0.25)

    def policy_update(self, batch: LossBatch, inputs: Any, chunk: list[int]) -> dict[str, float]:
        self.calls.append(("policy_update", tuple(chunk), batch.total_tokens, batch.total_samples))
        return {"loss": float(len(chunk)), "lr": 0.1 * len(self.calls), "skipped_updates": 0.0}

    def critic_update(self, batch: LossBatch, inputs: Any, chunk: list[int]) -> dict[str, float]:
        self.calls.append(("critic_update", tuple(chunk)))
        return {"value_loss": 1.0, "critic_lr": 0.2, "critic_skipped_updates": 0.0}

    def bind(self, batch: RolloutBatch) -> RolloutBatch:
        self.size = len(batch.samples)
        self.width = max(s.response_length for s in batch.samples)
        return batch

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] == name]


def recipe(recorder: Recorder, loss: Any = None, *, reference: Any = None, **options: Any) -> TrainStep:
    return TrainStep(recorder.parts(loss or StandInLoss(), reference=reference), TrainerOptions.from_values(options),
                     temperature=0.7)


# ------------------------------------------------------------------------------------------------
# the warm-up rule


def test_without_a_critic_the_policy_is_trained_during_the_warmup_steps():
    recorder = Recorder()
    step = recipe(recorder, critic_warmup_steps=3)
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert len(recorder.named("policy_update")) == 1
    assert metrics["train/updates"] == 1.0 and step.updates == 1 and step.steps == 1
    assert "train/policy_updated" not in metrics


def test_with_a_critic_the_policy_waits_for_the_warmup_steps():
    recorder = Recorder(critic=True)
    step = recipe(recorder, critic_warmup_steps=2)
    batch = recorder.bind(batch_of([[1.0, 0.0]]))
    updated = []
    for _ in range(3):
        metrics = step.run(batch)
        updated.append((metrics["train/policy_updated"], metrics["train/updates"]))
    assert updated == [(0.0, 0.0), (0.0, 0.0), (1.0, 1.0)]
    assert len(recorder.named("critic_update")) == 3 and len(recorder.named("policy_update")) == 1
    assert (step.steps, step.updates) == (3, 1)


def test_each_update_trains_the_policy_before_the_critic():
    recorder = Recorder(critic=True)
    recipe(recorder, global_batch_size=2).run(recorder.bind(batch_of([[1.0, 0.0, 1.0]])))
    updates = [call[0] for call in recorder.calls if call[0].endswith("update")]
    assert updates == ["policy_update", "critic_update", "policy_update", "critic_update"]


# ------------------------------------------------------------------------------------------------
# the loss batch


def test_old_logprobs_are_the_rollouts_when_the_loss_does_not_need_its_own():
    recorder = Recorder()
    loss = StandInLoss(needs_old_logprobs=False)
    metrics = recipe(recorder, loss).run(recorder.bind(batch_of([[1.0, 0.0]], rollout_logprobs=True)))
    assert not recorder.named("logprobs")
    assert torch.all(loss.seen.old_logprobs[loss.seen.response_mask > 0] == -0.5)
    assert "train/train_rollout_logprob_abs_diff" not in metrics        # no trainer log-probs to compare


def test_the_policy_computes_old_logprobs_when_the_loss_needs_them_or_the_rollout_has_none():
    for loss, rollout in ((StandInLoss(needs_old_logprobs=True), True), (StandInLoss(needs_old_logprobs=False), False)):
        recorder = Recorder()
        metrics = recipe(recorder, loss).run(recorder.bind(batch_of([[1.0, 0.0]], rollout_logprobs=rollout)))
        assert recorder.named("logprobs") == [("logprobs", POLICY, "inputs", 0.7)]
        assert torch.all(loss.seen.old_logprobs == -1.0)
        assert (loss.seen.rollout_logprobs is not None) == rollout
        if rollout:
            assert metrics["train/train_rollout_logprob_abs_diff"] == pytest.approx(0.5)


def test_reference_logprobs_and_critic_values_are_filled_in_when_there_are_a_reference_and_a_critic():
    recorder = Recorder(critic=True)
    loss = StandInLoss(needs_ref=True)
    recipe(recorder, loss, reference=REFERENCE).run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert [call[1] for call in recorder.named("logprobs")] == [POLICY, REFERENCE]
    assert torch.all(loss.seen.ref_logprobs == -2.0) and torch.all(loss.seen.values == 0.25)
    assert recorder.calls[0] == ("prepare", 2), "the samples are prepared once, before every pass"


def test_the_loss_batch_masks_and_counts_every_trained_token():
    recorder = Recorder()
    loss = StandInLoss()
    batch = recorder.bind(batch_of([[1.0, 0.0, 2.0]]))
    batch.samples[2].loss_mask = [1, 0, 1]
    recipe(recorder, loss).run(batch)
    assert loss.seen.response_mask.tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    assert (loss.seen.total_tokens, loss.seen.total_samples) == (5, 3)
    assert loss.seen.rewards.tolist() == [1.0, 0.0, 2.0] and loss.seen.group_index.tolist() == [0, 0, 0]


# ------------------------------------------------------------------------------------------------
# updates and metrics


def test_one_update_per_global_batch_with_the_chunks_totals():
    recorder = Recorder()
    step = recipe(recorder, global_batch_size=2)
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0], [1.0, 0.0], [1.0]])))
    # responses of 1, 2, 3, 1, 2 tokens
    assert recorder.named("policy_update") == [("policy_update", (0, 1), 3, 2), ("policy_update", (2, 3), 4, 2),
                                               ("policy_update", (4,), 2, 1)]
    assert metrics["train/updates"] == 3.0 and step.updates == 3
    assert metrics["train/loss"] == pytest.approx(5 / 3)                  # the mean over the updates
    assert metrics["train/lr"] == pytest.approx(0.1 * len(recorder.calls))   # the last update's
    assert (metrics["train/samples"], metrics["train/tokens"]) == (5.0, 9.0)
    assert metrics["train/seconds"] >= 0


def test_num_iterations_repeats_the_steps_updates_in_order_against_old_logprobs_taken_once():
    recorder = Recorder(critic=True)
    clip = iter([0.0, 0.0, 0.25, 0.75])                  # the second pass clips, the first does not

    def policy_update(batch: LossBatch, inputs: Any, chunk: list[int]) -> dict[str, float]:
        recorder.calls.append(("policy_update", tuple(chunk)))
        assert batch.old_logprobs is not None and torch.all(batch.old_logprobs == -1.0)
        return {"loss": 1.0, "lr": 0.1, "skipped_updates": 0.0, "clip_frac": next(clip)}

    recorder.policy_update = policy_update
    step = recipe(recorder, global_batch_size=2, num_iterations=2)
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0, 1.0]])))
    updates = [call[:2] for call in recorder.calls if call[0].endswith("update")]
    assert updates == [("policy_update", (0, 1)), ("critic_update", (0, 1)), ("policy_update", (2,)),
                       ("critic_update", (2,))] * 2
    assert len(recorder.named("logprobs")) == 1 and len(recorder.named("values")) == 1, "taken once, before"
    assert metrics["train/updates"] == 4.0 and (step.steps, step.updates) == (1, 4)
    assert metrics["train/clip_frac"] == pytest.approx(0.5), "the last pass's mean, not all four's"


def test_several_passes_take_a_snapshot_even_with_one_update_a_pass():
    recorder, snapshots = Recorder(), Snapshots()
    step = guarded(recorder, snapshots, max_update_ratio=0, num_iterations=3)
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert snapshots.taken == 1 and len(recorder.named("policy_update")) == 3 and metrics["train/updates"] == 3.0


def test_a_refusal_in_a_later_pass_refuses_the_whole_step():
    recorder, snapshots = Recorder(), Snapshots()
    answers = iter([{"loss": 1.0, "lr": 0.1, "skipped_updates": 0.0}, {"lr": 0.1, "bad_step/nonfinite_loss": 1.0}])
    recorder.policy_update = lambda batch, inputs, chunk: next(answers)
    step = guarded(recorder, snapshots, max_update_ratio=0, num_iterations=2)
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert metrics["train/bad_step/nonfinite_loss"] == 1.0 and metrics["train/updates"] == 0.0
    assert snapshots.restored == 1 and (step.steps, step.updates) == (0, 0)


def test_a_critic_reports_its_values_against_the_returns():
    recorder = Recorder(critic=True)
    metrics = recipe(recorder).run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert metrics["train/value_mean"] == 0.25 and metrics["train/value_loss"] == 1.0
    assert metrics["train/critic_lr"] == 0.2


def test_an_empty_batch_counts_no_step_and_calls_no_part():
    recorder = Recorder()
    step = recipe(recorder)
    metrics = step.run(RolloutBatch(rollout_id=0, groups=[]))
    assert {name: value for name, value in metrics.items() if name != "train/seconds"} == {
        "train/samples": 0.0, "train/tokens": 0.0, "train/updates": 0.0}
    assert not recorder.calls and step.steps == 0


@pytest.mark.parametrize("reward", [None, math.nan, math.inf])
def test_a_sample_without_a_finite_reward_is_an_error_that_names_it(reward):
    recorder = Recorder()
    batch = recorder.bind(batch_of([[1.0, 0.0, 1.0]]))
    batch.samples[1].reward = reward
    with pytest.raises(ValueError, match=r"sample 1 \(index 1, group 0\) has reward"):
        recipe(recorder).run(batch)
    assert not recorder.calls


def test_counters_resume_from_a_checkpoint():
    recorder = Recorder()
    step = recipe(recorder)
    step.restore({"steps": 4, "updates": 7, "other": "ignored"})
    step.run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert step.counters() == {"steps": 5, "updates": 8}


# ------------------------------------------------------------------------------------------------
# optimizer_update


class Summing:
    """A stand-in data-parallel sync: doubles gradients and metrics, as a second identical rank would."""

    def __init__(self) -> None:
        self.synced: list[int] = []

    def sum_gradients(self, parameters):
        parameters = list(parameters)
        self.synced.append(len(parameters))
        for parameter in parameters:
            parameter.grad.mul_(2)

    def sum_metrics(self, totals):
        return {name: 2 * value for name, value in totals.items()}


def sgd_on(weight: torch.Tensor, lr: float = 0.1) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.SGD([weight], lr=lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0 / (update + 1))


def test_optimizer_update_accumulates_micro_batches_syncs_clips_and_steps():
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    frozen = torch.nn.Parameter(torch.tensor([5.0]), requires_grad=False)
    optimizer, scheduler = sgd_on(weight)
    sync = Summing()
    micro = [(weight.sum() * 3.0, {"part": 1.0}), ((weight * torch.tensor([0.0, 1.0])).sum(), {"part": 2.0})]
    metrics = optimizer_update(optimizer, scheduler, [weight, frozen], iter(micro), clip_grad=5.0, sync=sync,
                               prefix="critic_")
    # gradient [3, 4] doubled by the sync: [6, 8], norm 10, clipped to 5: [3, 4]
    assert metrics == {"part": 6.0, "critic_grad_norm": pytest.approx(10.0), "critic_lr": 0.1,
                       "critic_skipped_updates": 0.0}
    assert sync.synced == [1], "only parameters with requires_grad are synced"
    assert weight.detach().tolist() == pytest.approx([1.0 - 0.3, 2.0 - 0.4])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05), "the scheduler stepped"


def test_optimizer_update_without_clipping_steps_the_whole_gradient():
    weight = torch.nn.Parameter(torch.tensor([0.0]))
    optimizer, scheduler = sgd_on(weight, lr=1.0)
    metrics = optimizer_update(optimizer, scheduler, [weight], [((weight * 100.0).sum(), {})], clip_grad=0.0)
    assert metrics["grad_norm"] == pytest.approx(100.0) and weight.item() == pytest.approx(-100.0)


def test_a_non_finite_loss_refuses_the_update_and_leaves_the_schedule():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer, scheduler = sgd_on(weight)
    metrics = optimizer_update(optimizer, scheduler, [weight], [((weight * math.inf).sum(), {"part": 1.0})],
                               clip_grad=1.0)
    assert metrics == {"part": 1.0, "lr": 0.1, "bad_step/nonfinite_loss": 1.0}
    assert weight.item() == 1.0 and weight.grad is None
    assert optimizer.param_groups[0]["lr"] == 0.1 and scheduler.last_epoch == 0, "the scheduler stepped"
    assert not optimizer.state, "the optimizer stepped"


def test_a_finite_loss_with_a_non_finite_gradient_refuses_the_update():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer, scheduler = sgd_on(weight)
    finite_loss_nan_grad = weight.sum() + torch.sqrt((weight * 0.0).sum())     # d sqrt(x)/dx at 0 is inf
    metrics = optimizer_update(optimizer, scheduler, [weight], [(finite_loss_nan_grad, {})], clip_grad=1.0,
                               prefix="critic_")
    assert metrics["bad_step/critic_nonfinite_grad_norm"] == 1.0 and "critic_grad_norm" not in metrics
    assert weight.item() == 1.0 and scheduler.last_epoch == 0


class OtherRankNaN(Summing):
    """A stand-in sync of two ranks where the other rank's micro-batch losses summed to NaN."""

    def sum_metrics(self, totals):
        return {name: (math.nan if name.endswith("loss") and "\0" in name else 2 * value)
                for name, value in totals.items()}


def test_a_non_finite_loss_on_another_rank_refuses_the_update_on_this_one():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer, scheduler = sgd_on(weight)
    metrics = optimizer_update(optimizer, scheduler, [weight], [(weight.sum(), {})], clip_grad=1.0,
                               sync=OtherRankNaN())
    assert metrics["bad_step/nonfinite_loss"] == 1.0 and weight.item() == 1.0


def test_micro_batch_forwards_run_after_the_gradients_are_zeroed():
    weight = torch.nn.Parameter(torch.tensor([1.0]))
    weight.grad = torch.tensor([100.0])                 # left over from an earlier update
    optimizer, scheduler = sgd_on(weight)
    seen = []

    def micro_losses():
        seen.append(weight.grad)
        yield weight.sum(), {}

    optimizer_update(optimizer, scheduler, [weight], micro_losses(), clip_grad=0.0)
    assert seen == [None] and weight.item() == pytest.approx(0.9)


# ------------------------------------------------------------------------------------------------
# refusing a bad step (plasmid_torch.step_guard)


class Snapshots:
    """A stand-in snapshot part: counts snapshots and restores, answers ``problem`` to the weight check."""

    def __init__(self, problem: str | None = None) -> None:
        self.taken = self.restored = 0
        self.problem = problem
        self.checked: list[float] = []

    def __call__(self) -> Snapshots:
        self.taken += 1
        return self

    def weights_problem(self, max_update_ratio: float) -> str | None:
        self.checked.append(max_update_ratio)
        return self.problem

    def restore(self) -> None:
        self.restored += 1


def guarded(recorder: Recorder, snapshots: Snapshots, **options: Any) -> TrainStep:
    parts = replace(recorder.parts(StandInLoss()), snapshot=snapshots)
    return TrainStep(parts, TrainerOptions.from_values(options), temperature=1.0)


def test_a_refused_second_update_refuses_the_whole_step_and_restores_the_first():
    recorder, snapshots = Recorder(), Snapshots()
    answers = iter([{"loss": 1.0, "lr": 0.1, "skipped_updates": 0.0}, {"lr": 0.1, "bad_step/nonfinite_loss": 1.0}])
    recorder.policy_update = lambda batch, inputs, chunk: next(answers)
    step = guarded(recorder, snapshots, global_batch_size=2, max_update_ratio=0)
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])))
    assert metrics["train/bad_step/nonfinite_loss"] == 1.0 and metrics["train/updates"] == 0.0
    assert metrics["train/samples"] == 6.0 and "train/advantage_mean" not in metrics
    assert all(math.isfinite(value) for value in metrics.values())
    assert (snapshots.taken, snapshots.restored) == (1, 1), "two updates: a snapshot, restored"
    assert (step.steps, step.updates) == (0, 0), "a refused step counts nothing"


def test_weights_that_blow_up_refuse_the_step_after_the_update():
    recorder, snapshots = Recorder(), Snapshots(problem="weights_blew_up")
    step = guarded(recorder, snapshots, max_update_ratio=0.5)
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert metrics["train/bad_step/weights_blew_up"] == 1.0 and metrics["train/loss"] == 2.0
    assert snapshots.checked == [0.5] and snapshots.restored == 1 and (step.steps, step.updates) == (0, 0)
    snapshots.problem = None
    metrics = step.run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert not [name for name in metrics if name.startswith("train/bad_step/")] and (step.steps, step.updates) == (1, 1)


def test_one_update_without_the_weight_check_takes_no_snapshot():
    recorder, snapshots = Recorder(), Snapshots()
    guarded(recorder, snapshots, max_update_ratio=0).run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert snapshots.taken == 0
    recorder = Recorder(critic=True)          # a policy and a critic update: the second may need undoing
    guarded(recorder, snapshots, max_update_ratio=0).run(recorder.bind(batch_of([[1.0, 0.0]])))
    assert snapshots.taken == 1 and snapshots.restored == 0


def adamw_setup(lr: float = 0.1) -> tuple[torch.nn.Linear, torch.optim.AdamW, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0 / (update + 1))


def adam_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    optimizer.zero_grad()
    model(torch.ones(4, 3)).pow(2).sum().backward()
    optimizer.step()
    scheduler.step()


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> list[Any]:
    tensors = [p.detach().clone() for p in model.parameters()]
    tensors += [value.clone() for state in optimizer.state.values() for value in state.values()]
    return [tensors, [group["lr"] for group in optimizer.param_groups], scheduler.last_epoch, len(optimizer.state)]


def same(a: list[Any], b: list[Any]) -> bool:
    return (len(a[0]) == len(b[0]) and all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True))
            and a[1:] == b[1:])


@pytest.mark.parametrize("steps_before", [0, 2])
def test_a_torch_snapshot_restores_weights_adamw_state_and_schedule_bit_for_bit(steps_before):
    model, optimizer, scheduler = adamw_setup()
    for _ in range(steps_before):
        adam_step(model, optimizer, scheduler)
    before = state_of(model, optimizer, scheduler)
    snapshot = TorchSnapshot(model.parameters(), optimizers=[optimizer], schedulers=[scheduler])
    optimizer.param_groups[0]["lr"] = 1e12
    adam_step(model, optimizer, scheduler)
    assert snapshot.weights_problem(1.0) == "weights_blew_up"
    assert snapshot.weights_problem(0.0) is None, "0 turns the check off"
    snapshot.restore()
    assert same(state_of(model, optimizer, scheduler), before)
    assert all(p.grad is None for p in model.parameters())
    # and the next step is the one an untouched copy takes
    twin, twin_optimizer, twin_scheduler = adamw_setup()
    for _ in range(steps_before):
        adam_step(twin, twin_optimizer, twin_scheduler)
    adam_step(model, optimizer, scheduler)
    adam_step(twin, twin_optimizer, twin_scheduler)
    assert same(state_of(model, optimizer, scheduler), state_of(twin, twin_optimizer, twin_scheduler))


def test_a_torch_snapshot_reports_non_finite_weights_and_accepts_a_normal_step():
    model, optimizer, scheduler = adamw_setup(lr=1e-3)
    snapshot = TorchSnapshot(model.parameters(), optimizers=[optimizer], schedulers=[scheduler])
    adam_step(model, optimizer, scheduler)
    assert snapshot.weights_problem(1.0) is None, "a normal AdamW step moves the weights a little"
    with torch.no_grad():
        model.weight[0, 0] = math.inf
    assert snapshot.weights_problem(1.0) == "nonfinite_weights"
    finite, _, _ = adamw_setup()
    asked: list[bool] = []
    agreeing = TorchSnapshot(finite.parameters(), agree=lambda flag: asked.append(flag) or True)
    assert agreeing.weights_problem(1.0) == "nonfinite_weights" and asked == [False], \
        "another rank's problem refuses the step here too"
