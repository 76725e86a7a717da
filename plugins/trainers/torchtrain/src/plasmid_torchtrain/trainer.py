"""The torch trainer: a Hugging Face causal LM trained in float32 on CPU with the run's loss.

Options read: ``--model`` (the policy, and the frozen reference when the loss needs one),
``--temperature`` (log-probs are taken at the sampling temperature, as the engine reports them),
the "training" group (``--lr``, ``--lr-schedule``, ``--lr-warmup-steps``, ``--min-lr``,
``--weight-decay``, ``--adam-beta1/2``, ``--clip-grad``, ``--global-batch-size``,
``--micro-batch-size``) and ``--num-rollouts`` (length of the LR schedule); with a loss that
``needs_critic``, also ``--critic-lr`` and ``--critic-warmup-steps`` (:mod:`.critic`).

The model stays in eval mode: dropout is off, so log-probs are deterministic and comparable
with the engine's.
"""

from __future__ import annotations

import copy
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from plasmid.types import LossBatch, RolloutBatch, Sample
from plasmid_torch.compute import run_compute
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.training import (
    batch_metrics,
    check_trainer_setup,
    critic_batch_metrics,
    index_chunks,
    pad_rows,
    update_metrics,
)
from plasmid_torchtrain import batching, checkpoint, critic, distributed, schedule, weights


class TorchTrainer:
    """The ``torchtrain`` trainer; built by the kernel as ``TorchTrainer(config, loss)``.

    Implements :class:`plasmid.protocols.Trainer`. The async methods run their computation in
    a worker thread, so an event loop shared with engines keeps serving while it trains.

    When the loss ``needs_critic`` (a :class:`plasmid.protocols.CriticLoss`) the trainer also
    owns a critic (:func:`plasmid_torchtrain.critic.load_value_model`) with its own AdamW
    optimizer at ``--critic-lr`` and the same LR schedule shape. Each step it computes the
    critic's values of the batch before any update (``LossBatch.values``), and in each optimizer
    update trains the critic on ``loss.value_loss`` after the policy on ``loss.policy_loss``.
    For the first ``--critic-warmup-steps`` steps only the critic is trained.
    """

    def __init__(self, config: Any, loss: Any) -> None:
        option = config.option
        check_trainer_setup("torchtrain", option, loss)
        self.config = config
        self.loss = loss
        self.model_dir = Path(option.model)
        self.temperature: float = option.temperature
        self.micro_batch_size: int = option.micro_batch_size
        #: this process's data-parallel rank (:mod:`.distributed`; one rank unless a runtime started more)
        self.dp = distributed.DataParallel.current()
        self.global_batch_size: int | None = option.global_batch_size
        self.clip_grad: float = option.clip_grad
        self.model = load_causal_lm(str(self.model_dir), "float32")
        self.model.requires_grad_(True)
        self.ref_model = None
        if loss.needs_ref:
            self.ref_model = copy.deepcopy(self.model).requires_grad_(False)
        pad_id = self.model.config.pad_token_id
        self.pad_id: int = pad_id if pad_id is not None else 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=option.lr,
                                           betas=(option.adam_beta1, option.adam_beta2),
                                           weight_decay=option.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule.lr_multiplier(option))
        self.critic: critic.ValueModel | None = None
        self.critic_warmup_steps: int = getattr(option, "critic_warmup_steps", 0) or 0
        if getattr(loss, "needs_critic", False):
            self.critic = critic.load_value_model(self.model_dir)
            critic_lr = getattr(option, "critic_lr", None) or option.lr
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=critic_lr,
                                                      betas=(option.adam_beta1, option.adam_beta2),
                                                      weight_decay=option.weight_decay)
            self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer,
                                                                      schedule.lr_multiplier(option))
        #: train_step calls completed (RL steps trained on).
        self.steps = 0
        #: optimizer updates of the policy made.
        self.updates = 0

    # ---------------------------------------------------------------------------------------------
    # Trainer protocol
    # ---------------------------------------------------------------------------------------------

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        """Log-probs of each sample's response tokens (``[response_length]`` each) under the
        current policy at ``temperature``; masked tokens included."""
        return await run_compute(self.compute_logprobs, samples, temperature)

    async def values(self, samples: list[Sample]) -> list[list[float]]:
        """The critic's value of each response token's state (``[response_length]`` each);
        only when the loss needs a critic."""
        return await run_compute(self.compute_values, samples)

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One RL step on ``batch``: old/ref log-probs, advantages, then one optimizer update per
        ``--global-batch-size`` samples (default: one for the whole batch), each accumulated over
        micro-batches of ``--micro-batch-size`` samples. Metrics are ``train/...`` floats."""
        return await run_compute(self.run_train_step, batch)

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's weights in Hugging Face names (each tensor once; a tied ``lm_head`` is
        not repeated), in buckets of at most ``bucket_bytes`` bytes of copied CPU tensors."""
        return weights.buckets(weights.hf_named_tensors(self.model), bucket_bytes)

    async def save(self, path: str) -> None:
        """Write checkpoint directory ``path`` (layout in :mod:`plasmid_torchtrain.checkpoint`)."""
        await run_compute(self.save_checkpoint, path)

    async def load(self, path: str) -> None:
        """Restore weights, optimizer, scheduler, RNG and counters from checkpoint ``path``, so
        that training continues exactly as if it had not stopped."""
        await run_compute(self.load_checkpoint, path)

    async def offload(self) -> None:
        """Nothing to do: the model lives in CPU memory, which engines do not compete for."""

    async def onload(self) -> None:
        """Nothing to do (see :meth:`offload`)."""

    # ---------------------------------------------------------------------------------------------
    # synchronous implementations
    # ---------------------------------------------------------------------------------------------

    def compute_logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        if not samples:
            return []
        padded = batching.pad_samples(samples, self.pad_id)
        values = self._no_grad_logprobs(self.model, padded, temperature)
        return [values[row, : sample.response_length].tolist() for row, sample in enumerate(samples)]

    def compute_values(self, samples: list[Sample]) -> list[list[float]]:
        if self.critic is None:
            raise ValueError(f"the loss {type(self.loss).__name__} has no critic (needs_critic is false): "
                             f"there are no values to compute")
        if not samples:
            return []
        padded = batching.pad_samples(samples, self.pad_id)
        values = self._no_grad_values(padded)
        return [values[row, : sample.response_length].tolist() for row, sample in enumerate(samples)]

    def run_train_step(self, batch: RolloutBatch) -> dict[str, float]:
        started = time.perf_counter()
        samples = batch.samples
        if not samples:
            return {"train/samples": 0.0, "train/tokens": 0.0, "train/updates": 0.0,
                    "train/seconds": time.perf_counter() - started}
        padded = batching.pad_samples(samples, self.pad_id)
        loss_batch, trainer_old = self._loss_batch(samples, padded)
        if self.critic is not None:
            loss_batch.values = self._no_grad_values(padded, sharded=True)
        loss_batch.advantages, loss_batch.returns = self.loss.advantages(loss_batch)
        train_policy = self.steps >= self.critic_warmup_steps

        per_update: list[dict[str, float]] = []
        for chunk in map(torch.tensor, index_chunks(len(samples), self.global_batch_size)):
            step_batch = replace(loss_batch.select(chunk), total_tokens=int(loss_batch.response_mask[chunk].sum()),
                                 total_samples=len(chunk))
            step_rows = padded.rows(chunk)
            update: dict[str, float] = {}
            if train_policy:
                update.update(self._update(step_batch, step_rows))
            if self.critic is not None:
                update.update(self._critic_update(step_batch, step_rows))
            per_update.append(update)
        self.steps += 1

        metrics = update_metrics(per_update)
        mask = loss_batch.response_mask
        if self.critic is not None:
            metrics.update(critic_batch_metrics(loss_batch))
            metrics["train/policy_updated"] = float(train_policy)
        metrics.update(batch_metrics(samples, loss_batch.advantages, mask, trainer_old))
        metrics["train/updates"] = float(len(per_update) if train_policy else 0)
        metrics["train/seconds"] = time.perf_counter() - started
        return metrics

    def save_checkpoint(self, path: str) -> None:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": checkpoint.rng_state(),
            "steps": self.steps,
            "updates": self.updates,
        }
        if self.critic is not None:
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        checkpoint.write(path, model=self.model, tokenizer_dir=self.model_dir, state=state, critic=self.critic)

    def load_checkpoint(self, path: str) -> None:
        saved = checkpoint.read_weights(path)
        expected = dict(weights.hf_named_tensors(self.model))
        missing, unexpected = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
        if missing or unexpected:
            raise ValueError(f"checkpoint {path} does not match --model {self.model_dir}: "
                             f"missing {missing[:5]}, unexpected {unexpected[:5]}")
        with torch.no_grad():
            for name, tensor in expected.items():
                tensor.copy_(saved[name])
        state = checkpoint.read_state(path)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            critic.load_critic_weights(self.critic, path)
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        checkpoint.set_rng_state(state["rng"])
        self.steps = state["steps"]
        self.updates = state["updates"]

    # ---------------------------------------------------------------------------------------------

    def _no_grad_logprobs(self, model: Any, padded: batching.PaddedBatch, temperature: float, *,
                          sharded: bool = False) -> torch.Tensor:
        """``[B, T]`` log-probs without gradient, in micro-batches; ``sharded`` (in a train step,
        a collective call): each data-parallel rank computes its shard and the rows are gathered."""
        parts = [torch.zeros((0, padded.response_mask.shape[1]))]
        with torch.no_grad():
            for rows in self._row_chunks(padded.size, sharded):
                values, _ = batching.response_logprobs(model, padded.rows(rows), temperature)
                parts.append(values)
        return self.dp.gather_rows(torch.cat(parts), padded.size) if sharded else torch.cat(parts)

    def _no_grad_values(self, padded: batching.PaddedBatch, *, sharded: bool = False) -> torch.Tensor:
        """``[B, T]`` critic values without gradient, in micro-batches (``sharded``: as above)."""
        parts = [torch.zeros((0, padded.response_mask.shape[1]))]
        with torch.no_grad():
            for rows in self._row_chunks(padded.size, sharded):
                parts.append(critic.response_values(self.critic, padded.rows(rows)))
        return self.dp.gather_rows(torch.cat(parts), padded.size) if sharded else torch.cat(parts)

    def _row_chunks(self, size: int, sharded: bool) -> Iterator[torch.Tensor]:
        if sharded:
            return self.dp.micro_batches(size, self.micro_batch_size)
        return map(torch.tensor, index_chunks(size, self.micro_batch_size))

    def _loss_batch(self, samples: list[Sample], padded: batching.PaddedBatch) -> tuple[LossBatch, Any]:
        """The step's :class:`LossBatch`, and the trainer's old log-probs (``None`` when the loss
        does not need them and the rollout's are used instead)."""
        width = padded.response_mask.shape[1]
        for position, sample in enumerate(samples):
            if sample.reward is None or not math.isfinite(sample.reward):
                raise ValueError(f"sample {position} (index {sample.index}, group {sample.group_index}) has reward "
                                 f"{sample.reward!r}: every sample must be scored with a finite reward before training")
        have_rollout = all(s.rollout_logprobs is not None for s in samples)
        rollout = pad_rows([s.rollout_logprobs for s in samples], width) if have_rollout else None
        trainer_old = None
        if self.loss.needs_old_logprobs or rollout is None:
            trainer_old = self._no_grad_logprobs(self.model, padded, self.temperature, sharded=True)
        ref = None
        if self.ref_model is not None:
            ref = self._no_grad_logprobs(self.ref_model, padded, self.temperature, sharded=True)
        batch = LossBatch(
            rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
            group_index=torch.tensor([s.group_index for s in samples], dtype=torch.long),
            response_mask=padded.response_mask,
            old_logprobs=trainer_old if trainer_old is not None else rollout,
            ref_logprobs=ref,
            rollout_logprobs=rollout,
            total_tokens=int(padded.response_mask.sum()),
            total_samples=len(samples),
        )
        return batch, trainer_old

    def _update(self, step_batch: LossBatch, step_rows: batching.PaddedBatch) -> dict[str, float]:
        """One policy optimizer update on ``step_batch`` (normalised by its totals); each
        data-parallel rank backpropagates its shard, gradients and loss metrics are summed."""
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = defaultdict(float)
        for micro in self.dp.micro_batches(step_rows.size, self.micro_batch_size):
            logprobs, entropy = batching.response_logprobs(self.model, step_rows.rows(micro), self.temperature,
                                                           with_entropy=True)
            value, loss_metrics = self.loss.policy_loss(step_batch.select(micro), logprobs, entropy)
            value.backward()
            totals["loss"] += float(value.detach())
            for name, metric in loss_metrics.items():
                totals[name] += float(metric)
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.dp.sum_gradients(parameters)
        totals = self.dp.sum_metrics(totals)
        max_norm = self.clip_grad if self.clip_grad and self.clip_grad > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
        lr = self.optimizer.param_groups[0]["lr"]
        skipped = not math.isfinite(grad_norm)
        if skipped:   # a non-finite gradient would poison the weights: drop this update
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.updates += 1
        return {**totals, "grad_norm": grad_norm, "lr": lr, "skipped_updates": float(skipped)}

    def _critic_update(self, step_batch: LossBatch, step_rows: batching.PaddedBatch) -> dict[str, float]:
        """One critic optimizer update on ``loss.value_loss`` over ``step_batch``."""
        self.critic_optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = defaultdict(float)
        for micro in self.dp.micro_batches(step_rows.size, self.micro_batch_size):
            values = critic.response_values(self.critic, step_rows.rows(micro))
            value, loss_metrics = self.loss.value_loss(step_batch.select(micro), values)
            value.backward()
            for name, metric in loss_metrics.items():
                totals[name] += float(metric)
        self.dp.sum_gradients(self.critic.parameters())
        totals = self.dp.sum_metrics(totals)
        max_norm = self.clip_grad if self.clip_grad and self.clip_grad > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(list(self.critic.parameters()), max_norm))
        lr = self.critic_optimizer.param_groups[0]["lr"]
        skipped = not math.isfinite(grad_norm)
        if skipped:
            self.critic_optimizer.zero_grad(set_to_none=True)
        else:
            self.critic_optimizer.step()
        self.critic_scheduler.step()
        return {**totals, "critic_grad_norm": grad_norm, "critic_lr": lr, "critic_skipped_updates": float(skipped)}
