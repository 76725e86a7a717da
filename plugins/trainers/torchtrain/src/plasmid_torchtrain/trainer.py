"""The torch trainer: a Hugging Face causal LM trained with the run's loss, on the CPU or a GPU.

Options read, once, in ``__init__``: ``--model`` (the policy, and the frozen reference when the
loss needs one; :class:`plasmid.kernel_options.GeneralOptions`), ``--temperature`` (log-probs are
taken at the sampling temperature, as the engine reports them) and ``--num-rollouts``,
``--prompts-per-step``, ``--n-samples-per-prompt`` (the length of the LR schedule;
:class:`plasmid.kernel_options.RolloutOptions`), and the "training" group
(:class:`plasmid_torch.trainer_options.TrainerOptions`: ``--lr``, ``--lr-schedule``,
``--lr-warmup-steps``, ``--min-lr``, ``--weight-decay``, ``--adam-beta1/2``, ``--clip-grad``,
``--global-batch-size``, ``--micro-batch-size``, ``--max-update-ratio``; with a loss that
``needs_critic``, also ``--critic-lr`` and ``--critic-warmup-steps``, :mod:`.critic`), the
"device" group (:class:`plasmid_torch.device_options.DeviceOptions`: ``--device``, ``--precision``,
``--attn-implementation``, shared with torchgen; AdamW is fused on CUDA) and its own
(:class:`plasmid_torchtrain.options.TorchtrainOptions`: ``--gradient-checkpointing``,
``--optimizer-offload``); ``--profile`` (:class:`plasmid.kernel_options.ProfileOptions`): each
update also reports ``train/forward_backward_seconds`` and ``train/optimizer_seconds``
(:func:`plasmid_torch.training.timed_update`; with a critic, ``train/critic_...`` too).

Batches are padded on the CPU; each forward pass moves its micro-batch's ids to the device and
brings the ``[B, T]`` log-probs back, so the losses and the step recipe compute on CPU tensors
whatever the device (:func:`plasmid_torchtrain.batching.response_logprobs`).

A bad step (a non-finite loss or gradient norm, weights that blow up) is refused whole and leaves
weights, AdamW states, LR schedules and counters as they were (:mod:`plasmid_torch.step_guard`;
the copy it restores from is of the trained weights and both optimizers' states, in CPU memory).

The step itself is the library's recipe (:class:`plasmid_torch.train_step.TrainStep`); this trainer
supplies its parts: padded tensors of the samples, no-grad log-probs and values sharded over the
data-parallel ranks (:mod:`.distributed`), and policy and critic updates made with
:func:`plasmid_torch.optimizer_update.optimizer_update`.

The model stays in eval mode: dropout is off, so log-probs are deterministic and comparable
with the engine's.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, ProfileOptions, RolloutOptions
from plasmid.options import Options
from plasmid.protocols import Loss
from plasmid.types import LossBatch, RolloutBatch, Sample
from plasmid_torch import heap, packing
from plasmid_torch.compute import run_compute
from plasmid_torch.device import enable_gradient_checkpointing, offload_optimizer_state, placement
from plasmid_torch.device_options import DeviceOptions
from plasmid_torch.optimizer_update import optimizer_update
from plasmid_torch.step_guard import TorchSnapshot
from plasmid_torch.train_step import CriticParts, StepCounters, TrainerParts, TrainStep
from plasmid_torch.trainer_options import TrainerOptions
from plasmid_torch.training import check_trainer_setup, timed_update
from plasmid_torch.vision import ImageInputs, is_vision_config, vision_tower
from plasmid_torchtrain import batching, checkpoint, critic, distributed, lora, schedule, weights
from plasmid_torchtrain.options import TorchtrainOptions

#: the bucket size of a LoRA checkpoint's merged weights (one safetensors file each; a rank holds one bucket whole)
LORA_SAVE_BUCKET_BYTES = 1 << 30


def _sharded(config: Config) -> bool:
    """Whether the trainer of this process shards its policy with FSDP2: several data-parallel
    ranks and ``--torchtrain-sharding fsdp``."""
    return distributed.DataParallel.current().enabled and TorchtrainOptions.of(config).torchtrain_sharding == "fsdp"


class TorchTrainer(StepCounters):
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

    option_classes: ClassVar[tuple[type[Options], ...]] = (TrainerOptions, GeneralOptions, RolloutOptions,
                                                                 DeviceOptions, TorchtrainOptions, ProfileOptions)
    #: whether the policy is sharded with FSDP2 (:class:`ShardedTorchTrainer`)
    sharded: ClassVar[bool] = False

    def __new__(cls, config: Config, loss: Loss) -> TorchTrainer:
        """A :class:`ShardedTorchTrainer` when this process is one of several FSDP2 ranks."""
        if cls is TorchTrainer and _sharded(config):
            cls = ShardedTorchTrainer
        return super().__new__(cls)

    def __init__(self, config: Config, loss: Loss) -> None:
        general = GeneralOptions.of(config)
        check_trainer_setup("torchtrain", general, loss)
        rollout = RolloutOptions.of(config)
        #: the run's trainer options ("training" group)
        self.options = options = TrainerOptions.of(config)
        self.config = config
        self.loss = loss
        #: ``--profile``: each update reports its forward/backward and optimizer seconds (device synchronised)
        self.profile = ProfileOptions.of(config).profile
        self.model_dir = Path(general.model)
        self.temperature: float = rollout.temperature
        #: this process's data-parallel rank (:mod:`.distributed`; one rank unless a runtime started more)
        self.dp = distributed.DataParallel.current()
        #: the torchtrain-only options (memory savers)
        self.own_options = own = TorchtrainOptions.of(config)
        #: device and precision (``--device``, ``--precision``, ``--attn-implementation``)
        self.place = placement(DeviceOptions.of(config), "torchtrain")
        own.check_device(self.place.device.type)
        if self.place.device.type == "cpu" and own.mmap_threshold():   # freed activations go back to
            heap.map_large_blocks(own.mmap_threshold())                  # the system (plasmid_torch.heap)
        self.model = self.place.load_causal_lm(str(self.model_dir))
        self.model.requires_grad_(True)
        if own.freeze_vision_tower and is_vision_config(self.model.config):
            vision_tower(self.model).requires_grad_(False)       # before the optimizer: no state for it
        #: the exported tensors' names (each once: tied ones under the first name)
        self.export_names = [name for name, _ in weights.hf_named_tensors(self.model)]
        #: whether the policy trains LoRA adapters (``--lora-rank`` > 0; :mod:`.lora`)
        self.lora = own.lora_rank > 0
        if self.lora:
            self.model = lora.add_adapters(self.model, rank=own.lora_rank, alpha=own.lora_alpha,
                                           dropout=own.lora_dropout, target_modules=own.lora_target_modules)
            self.dp.broadcast(lora.adapter_parameters(self.model).values())     # every rank starts from rank 0's
        if own.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        if own.torchtrain_packing:      # before the reference copies it
            packing.enable(self.model)
        #: whether samples with one prompt share its forward pass (:func:`batching.response_outputs`):
        #: not with gradient checkpointing (the model then keeps no KV cache while training); for an
        #: FSDP2 policy see :meth:`_shares`
        self.share_prompts = not own.gradient_checkpointing
        self.ref_model: Any = None
        if loss.needs_ref:      # with LoRA: the same model, adapters disabled (no second copy)
            self.ref_model = (lora.AdaptersDisabled(self.model) if self.lora
                              else copy.deepcopy(self.model).requires_grad_(False))
        #: how an update combines the ranks' gradients and metrics
        self.sync: Any = self.dp
        if self.sharded:
            distributed.shard_model(self.model, self.dp.world, self.place.device.type)
            self.sync = distributed.ShardedSync(self.dp)
        pad_id = self.model.config.get_text_config().pad_token_id      # a VLM keeps it in its text config
        self.pad_id: int = pad_id if pad_id is not None else 0
        #: a vision-language policy's image inputs, rebuilt from the samples' references (else ``None``)
        self.images = ImageInputs(str(self.model_dir)) if is_vision_config(self.model.config) else None
        lr_multiplier = schedule.lr_multiplier(options, rollout)
        self.optimizer = self._adamw(self.model, options.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_multiplier)
        self.critic: critic.ValueModel | None = None
        critic_parts = None
        if loss.needs_critic:
            self.critic = critic.load_value_model(self.model_dir, self.place)
            if own.torchtrain_packing:
                packing.enable(self.critic.backbone)
            if own.gradient_checkpointing:
                enable_gradient_checkpointing(self.critic.backbone)
            self.critic_optimizer = self._adamw(self.critic, options.critic_learning_rate)
            self.critic_scheduler = torch.optim.lr_scheduler.LambdaLR(self.critic_optimizer, lr_multiplier)
            critic_parts = CriticParts(values=self._step_values, update=self._critic_update)
        #: the train-step recipe, with this trainer's parts; it keeps the step and update counters
        self.recipe = TrainStep(TrainerParts(loss=loss, policy=self.model, reference=self.ref_model,
                                             logprobs=self._step_logprobs, policy_update=self._update,
                                             critic=critic_parts, prepare=self._pad, snapshot=self._snapshot,
                                             fills_old_logprobs=self._forward_is_no_grad_pass()),
                                options, temperature=self.temperature)

    def _adamw(self, model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
        options = self.options
        trained = [parameter for parameter in model.parameters() if parameter.requires_grad]   # LoRA: the adapters
        optimizer = self.place.adamw(trained, lr=lr, betas=(options.adam_beta1, options.adam_beta2),
                                     weight_decay=options.weight_decay)
        if self.own_options.optimizer_offload:
            offload_optimizer_state(optimizer)
        return optimizer

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
        """One RL step on ``batch`` (:class:`plasmid_torch.train_step.TrainStep`): old/ref
        log-probs, advantages, then one optimizer update per ``--global-batch-size`` samples
        (default: one for the whole batch), each accumulated over micro-batches of
        ``--micro-batch-size`` samples. Metrics are ``train/...`` floats."""
        return await run_compute(self.recipe.run, batch)

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's weights in Hugging Face names (each tensor once; a tied ``lm_head`` is
        not repeated), in buckets of at most ``bucket_bytes`` bytes of copied CPU tensors."""
        if self.sharded:
            distributed.reshard(self.model)
        if self.lora:
            return weights.buckets(lora.merged_tensors(self.model, self.export_names), bucket_bytes)
        return weights.buckets(weights.named_tensors(self.model, self.export_names), bucket_bytes)

    def shared_weights(self) -> list[tuple[str, torch.Tensor]] | None:
        """The policy's live tensors in Hugging Face names (each once), for an engine in this process to
        serve in place (:class:`plasmid.protocols.SupportsSharedWeights`: this trainer changes them only
        in place); ``None`` when sharded (each rank holds a shard) or with LoRA (served weights are
        merged copies)."""
        if self.sharded or self.lora:
            return None
        return list(weights.named_tensors(self.model, self.export_names))

    def save_adapters(self, directory: str) -> int:
        """Write the policy's LoRA adapters alone, in peft's format (``adapter_model.safetensors``,
        ``adapter_config.json``), to ``directory`` (replaced whole: written beside it, then renamed)
        for an engine that serves them on top of ``--model``'s weights (plasmid-vllm's
        ``--weight-sync vllm-lora``); the bytes of adapter tensors written. Called in the trainer's
        process; on a sharded trainer by every rank (a collective call; rank 0 writes).

        :raises UsageError: the trainer trains every weight (no ``--lora-rank``).
        """
        if not self.lora:
            raise UsageError("torchtrain: sending adapters alone needs --lora-rank R (this trainer trains every "
                             "weight); use a weight sync that sends the weights")
        if self.sharded:
            distributed.reshard(self.model)
        state = lora.adapter_state(self.model)
        if self.dp.rank == 0:
            checkpoint.replace_directory(Path(directory), lambda staging: lora.save_adapters(self.model, staging,
                                                                                             state))
        if self.sharded:
            import torch.distributed as dist

            dist.barrier()
        return sum(weights.tensor_bytes(tensor) for tensor in state.values())

    async def save(self, path: str) -> None:
        """Write checkpoint directory ``path`` (layout in :mod:`plasmid_torchtrain.checkpoint`)."""
        await run_compute(self.save_checkpoint, path)

    async def load(self, path: str) -> None:
        """Restore weights, optimizer, scheduler, RNG and counters from checkpoint ``path``, so
        that training continues exactly as if it had not stopped."""
        await run_compute(self.load_checkpoint, path)

    async def offload(self) -> None:
        """Nothing to do: on the CPU the model lives in host memory, which engines do not compete
        for; on a GPU it stays resident (a colocated engine shares the GPU with it)."""

    async def onload(self) -> None:
        """Nothing to do (see :meth:`offload`)."""

    # ---------------------------------------------------------------------------------------------
    # synchronous implementations
    # ---------------------------------------------------------------------------------------------

    def compute_logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        if not samples:
            return []
        padded = self._pad(samples)
        values = self._no_grad_logprobs(self.model, padded, temperature)
        return [values[row, : sample.response_length].tolist() for row, sample in enumerate(samples)]

    def compute_values(self, samples: list[Sample]) -> list[list[float]]:
        if self.critic is None:
            raise ValueError(f"the loss {type(self.loss).__name__} has no critic (needs_critic is false): "
                             f"there are no values to compute")
        if not samples:
            return []
        padded = self._pad(samples)
        values = self._no_grad_values(padded)
        return [values[row, : sample.response_length].tolist() for row, sample in enumerate(samples)]

    def save_checkpoint(self, path: str) -> None:
        state = {
            "scheduler": self.scheduler.state_dict(),
            "rng": checkpoint.rng_state(),
            **self.recipe.counters(),
        }
        if self.critic is not None:
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        if self.lora:           # the adapters' AdamW state goes to dcp/ (any number of ranks resumes it)
            checkpoint.write_adapters(path, model=self.model, optimizer=self.optimizer,
                                      merged=self.export_weights(LORA_SAVE_BUCKET_BYTES), tokenizer_dir=self.model_dir,
                                      state=state, rank=self.dp.rank if self.sharded else 0,
                                      collective=self.sharded, critic=self.critic)
            return
        state["optimizer"] = self.optimizer.state_dict()
        checkpoint.write(path, model=self.model, tokenizer_dir=self.model_dir, state=state, critic=self.critic)

    def load_checkpoint(self, path: str) -> None:
        if checkpoint.is_sharded(path):      # written by an FSDP2 trainer of any number of ranks, or LoRA adapters
            lora.check_adapters(path, lora=self.lora)
            checkpoint.read_sharded(path, model=self.model, optimizer=self.optimizer, collective=self.sharded,
                                    trainable_only=self.lora)
            self._load_rest(path, checkpoint.read_state(path))
            return
        if self.lora:           # the adapters of an older one-rank checkpoint (the base weights are --model's)
            lora.load_adapters(self.model, path)
            state = checkpoint.read_state(path)
            self.optimizer.load_state_dict(state["optimizer"])
            self._load_rest(path, state)
            return
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
        self._load_rest(path, state)

    def _load_rest(self, path: str, state: dict[str, Any]) -> None:
        """What a checkpoint holds besides the policy and its optimizer: the scheduler, the
        critic, RNG states, counters."""
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            critic.load_critic_weights(self.critic, path)
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        checkpoint.set_rng_state(state["rng"])
        self.recipe.restore(state)

    # ---------------------------------------------------------------------------------------------
    # the parts of the train step (plasmid_torch.train_step.TrainerParts)
    # ---------------------------------------------------------------------------------------------

    def _pad(self, samples: list[Sample]) -> batching.PaddedBatch:
        return batching.pad_samples(samples, self.pad_id, self.images)

    def _step_logprobs(self, model: Any, padded: batching.PaddedBatch, temperature: float) -> torch.Tensor:
        """``[B, T]`` no-grad log-probs in a train step: sharded over the data-parallel ranks, gathered."""
        return self._no_grad_logprobs(model, padded, temperature, sharded=True)

    def _step_values(self, padded: batching.PaddedBatch) -> torch.Tensor:
        """``[B, T]`` no-grad critic values in a train step: sharded over the data-parallel ranks, gathered."""
        return self._no_grad_values(padded, sharded=True)

    def _forward_is_no_grad_pass(self) -> bool:
        """Whether an update's forward pass computes, bit for bit, the log-probs that the no-grad
        pass of the step computes on the same micro-batch (``TrainerParts.fills_old_logprobs``):
        on the CPU (checked on the tiny Qwen2: the two passes' log-probs are equal, max |diff| 0.0;
        on CUDA, attention may pick another kernel when gradients are needed, not checked yet), one
        rank (the no-grad pass and the update then cut the same micro-batches), and no dropout in
        the update (the model stays in eval mode; LoRA dropout is on in updates only)."""
        return (self.place.device.type == "cpu" and not self.dp.enabled
                and not (self.lora and self.own_options.lora_dropout > 0))

    def _update(self, batch: LossBatch, padded: batching.PaddedBatch, chunk: list[int], *,
                old_logprobs_out: torch.Tensor | None = None) -> dict[str, float]:
        """One policy optimizer update on the samples ``chunk`` (normalised by the chunk's totals,
        which ``batch`` carries); each data-parallel rank backpropagates its shard.

        With ``old_logprobs_out`` (``[B, T]``, the step's rows; the batch's ``old_logprobs`` then
        ``None``: an exactly on-policy step, :meth:`plasmid_torch.train_step.TrainStep.reuses_update_forward`)
        each micro-batch's forward log-probs, detached, are its old log-probs, written into the
        rows ``chunk[micro]``."""
        rows = torch.tensor(chunk)
        chunk_batch, chunk_rows = batch.select(rows), padded.rows(rows)

        def micro_losses() -> Iterator[tuple[torch.Tensor, dict[str, float]]]:
            for micro in self._micro_batches(chunk_rows, sharded=True, equal=self.sharded):
                if not len(micro):      # FSDP2: a forward and backward every rank runs; contributes nothing
                    logprobs, _ = batching.response_logprobs(self.model, chunk_rows.rows(torch.tensor([0])),
                                                             self.temperature, place=self.place)
                    yield logprobs.sum() * 0.0, {}
                    continue
                with lora.dropout_active(self.model) if self.lora else contextlib.nullcontext():
                    logprobs, entropy = batching.response_logprobs(self.model, chunk_rows.rows(micro),
                                                                   self.temperature, with_entropy=True,
                                                                   place=self.place,
                                                                   **self._passes(self.model))
                micro_batch = chunk_batch.select(micro)
                if old_logprobs_out is not None and micro_batch.old_logprobs is None:
                    micro_batch.old_logprobs = logprobs.detach()
                    old_logprobs_out[rows[micro]] = micro_batch.old_logprobs
                value, metrics = self.loss.policy_loss(micro_batch, logprobs, entropy)
                yield value, {"loss": float(value.detach()), **metrics}

        def update(losses: Iterator[tuple[torch.Tensor, dict[str, float]]]) -> dict[str, float]:
            return optimizer_update(self.optimizer, self.scheduler, self._policy_parameters(), losses,
                                    clip_grad=self.options.clip_grad, sync=self.sync)

        return timed_update(update, micro_losses(), self.place.device) if self.profile else update(micro_losses())

    def _policy_parameters(self) -> list[torch.nn.Parameter]:
        """The policy's parameters as its optimizer holds them (an FSDP2 model's sharded DTensors,
        even while a forward pass left its root's whole parameters registered)."""
        return [parameter for group in self.optimizer.param_groups for parameter in group["params"]]

    def _snapshot(self) -> TorchSnapshot:
        """What a step changes (policy and critic weights, AdamW states, LR schedules), to put back
        when the step is refused; the weight check's answer agrees over the data-parallel ranks."""
        models = [self.critic] if self.critic is not None else []
        optimizers = [self.optimizer] + ([self.critic_optimizer] if self.critic is not None else [])
        schedulers = [self.scheduler] + ([self.critic_scheduler] if self.critic is not None else [])
        trained = [distributed.local(p) for p in self._policy_parameters() if p.requires_grad]
        trained += [p for model in models for p in model.parameters() if p.requires_grad]
        return TorchSnapshot(trained, optimizers=optimizers, schedulers=schedulers, agree=self.dp.any)

    def _critic_update(self, batch: LossBatch, padded: batching.PaddedBatch, chunk: list[int]) -> dict[str, float]:
        """One critic optimizer update on ``loss.value_loss`` over the samples ``chunk``."""
        rows = torch.tensor(chunk)
        chunk_batch, chunk_rows = batch.select(rows), padded.rows(rows)

        def micro_losses() -> Iterator[tuple[torch.Tensor, dict[str, float]]]:
            for micro in self._micro_batches(chunk_rows, sharded=True):
                values = critic.response_values(self.critic, chunk_rows.rows(micro), self.place,
                                                **self._passes(self.critic))
                yield self.loss.value_loss(chunk_batch.select(micro), values)

        def update(losses: Iterator[tuple[torch.Tensor, dict[str, float]]]) -> dict[str, float]:
            return optimizer_update(self.critic_optimizer, self.critic_scheduler, self.critic.parameters(), losses,
                                    clip_grad=self.options.clip_grad, sync=self.dp, prefix="critic_")

        if self.profile:
            return timed_update(update, micro_losses(), self.place.device, prefix="critic_")
        return update(micro_losses())

    # ---------------------------------------------------------------------------------------------

    def _no_grad_logprobs(self, model: Any, padded: batching.PaddedBatch, temperature: float, *,
                          sharded: bool = False) -> torch.Tensor:
        """``[B, T]`` log-probs without gradient, in micro-batches; ``sharded`` (in a train step,
        a collective call): each data-parallel rank computes its shard and the rows are gathered."""
        parts = [torch.zeros((0, padded.response_mask.shape[1]))]
        with torch.no_grad():
            for rows in self._micro_batches(padded, sharded=sharded, equal=self.sharded):
                if not len(rows):       # FSDP2: a forward pass every rank runs; its result is dropped
                    batching.response_logprobs(model, padded.rows(torch.tensor([0])), temperature, place=self.place)
                    continue
                values, _ = batching.response_logprobs(model, padded.rows(rows), temperature, place=self.place,
                                                       **self._passes(model))
                parts.append(values)
        return self.dp.gather_rows(torch.cat(parts), padded.size) if sharded else torch.cat(parts)

    def _no_grad_values(self, padded: batching.PaddedBatch, *, sharded: bool = False) -> torch.Tensor:
        """``[B, T]`` critic values without gradient, in micro-batches (``sharded``: as above)."""
        parts = [torch.zeros((0, padded.response_mask.shape[1]))]
        with torch.no_grad():
            for rows in self._micro_batches(padded, sharded=sharded):
                parts.append(critic.response_values(self.critic, padded.rows(rows), self.place,
                                                    **self._passes(self.critic)))
        return self.dp.gather_rows(torch.cat(parts), padded.size) if sharded else torch.cat(parts)

    def _passes(self, model: Any) -> dict[str, bool]:
        """How ``model``'s passes may run (:func:`batching.response_outputs`): ``share_prompts``
        (:meth:`_shares`) and ``pack`` (``--torchtrain-packing``; the model was made to take packed
        batches at start-up)."""
        return {"share_prompts": self._shares(model), "pack": self.own_options.torchtrain_packing}

    def _shares(self, model: Any) -> bool:
        """Whether ``model``'s passes (the policy's, the reference's, the critic's) share prompts
        (:func:`batching.response_outputs`): as each micro-batch allows, on every rank of replicated
        data parallelism too (the reference and the critic are always replicated), but not for an
        FSDP2 policy (a LoRA reference wrapper around it takes one pass anyway). Its forward calls
        are collectives, so ranks would have to make two per micro-batch whatever their samples,
        and each call all-gathers the parameters again: measured with 2 gloo ranks and one-token
        responses, that made the train step 50-58 -> 63-71 ms."""
        return self.share_prompts and not (self.sharded and model is self.model)

    def _micro_batches(self, padded: batching.PaddedBatch, *, sharded: bool,
                       equal: bool = False) -> Iterator[torch.Tensor]:
        """The rows of ``padded`` in micro-batches of at most ``--micro-batch-size`` samples and
        ``--max-tokens-per-micro-batch`` tokens (prompt + response), in order; ``sharded``: this
        data-parallel rank's shard only (``equal``: :meth:`distributed.DataParallel.micro_batches`)."""
        lengths = (padded.prompt_lengths + padded.response_lengths).tolist()
        dp = self.dp if sharded else distributed.DataParallel()
        return dp.micro_batches(padded.size, self.options.micro_batch_size, equal=equal, lengths=lengths,
                                max_tokens=self.options.max_tokens_per_micro_batch)


class ShardedTorchTrainer(TorchTrainer):
    """The torch trainer as one of several FSDP2 ranks (``--trainer-workers N`` with
    ``--torchtrain-sharding fsdp``, the default): built in place of :class:`TorchTrainer` by its
    ``__new__``. Its policy is sharded (:func:`plasmid_torchtrain.distributed.shard_model`), so it
    is *collective* (:class:`plasmid.protocols.Trainer`): the runtime calls every method on every
    rank. Losses, gradient norms and updated weights equal one process training the whole batch
    (to float rounding of the summation order). Checkpoints go through
    ``torch.distributed.checkpoint`` (:func:`plasmid_torchtrain.checkpoint.write_sharded`; a LoRA
    policy's: :func:`plasmid_torchtrain.checkpoint.write_adapters`) and load back on any number of
    ranks. With ``--lora-rank`` the peft model is sharded (frozen base weights and adapters alike),
    its adapters start from rank 0's initialisation, and only they have gradients and AdamW state."""

    collective: ClassVar[bool] = True
    sharded: ClassVar[bool] = True

    def save_checkpoint(self, path: str) -> None:
        distributed.reshard(self.model)
        if self.lora:
            super().save_checkpoint(path)
            return
        state: dict[str, Any] = {"scheduler": self.scheduler.state_dict(), "rng": checkpoint.rng_state(),
                                 **self.recipe.counters()}
        if self.critic is not None:
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        checkpoint.write_sharded(path, model=self.model, optimizer=self.optimizer, tokenizer_dir=self.model_dir,
                                 state=state, rank=self.dp.rank, critic=self.critic)

    def load_checkpoint(self, path: str) -> None:
        if not checkpoint.is_sharded(path):
            raise ValueError(f"checkpoint {path} was written by a trainer of one rank (no {checkpoint.DCP_SUBDIR}/): "
                             f"resume it with --trainer-workers 1, or with --torchtrain-sharding replicate")
        distributed.reshard(self.model)
        super().load_checkpoint(path)
