"""The megatron trainer: a Hugging Face causal LM trained as a megatron-core ``GPTModel`` with the run's loss.

Options read, once, in ``__init__`` (:attr:`MegatronTrainer.option_classes`): ``--model`` (the
policy, and the frozen reference when the loss needs one) and ``--seed``
(:class:`plasmid.kernel_options.GeneralOptions`), ``--temperature`` (log-probs at the sampling
temperature, as the engine reports them) and ``--num-rollouts``, ``--prompts-per-step``,
``--n-samples-per-prompt`` (the length of the LR schedule; :class:`plasmid.kernel_options.RolloutOptions`),
the "training" group (:class:`plasmid_torch.trainer_options.TrainerOptions`: ``--lr``,
``--lr-schedule``, ``--lr-warmup-steps``, ``--min-lr``, ``--weight-decay``, ``--adam-beta1/2``,
``--clip-grad``, ``--global-batch-size``, ``--micro-batch-size``; with a loss that ``needs_critic``
(PPO), also ``--critic-lr`` and ``--critic-warmup-steps``, :mod:`plasmid_megatron.critic`), this
plugin's group (:class:`plasmid_megatron.options.MegatronOptions`: the parallel sizes,
``--max-tokens-per-micro-batch``, ``--make-vocab-size-divisible-by``) and the native
``--megatron-*`` fields (:mod:`plasmid_megatron.native_options`).

The step is the library's recipe (:class:`plasmid_torch.train_step.TrainStep`, the same as the torch
trainer's); this trainer supplies its parts: vocabulary-parallel no-grad log-probs and critic values,
and policy and critic updates with megatron's ``forward_backward_func`` and optimizer. How a step runs
(every rank of the trainer's world calls the same methods with the same batch):

1. log-probs of the policy before the update (and of the reference), and with a critic its values
   (``LossBatch.values``: the value of each response token's state, read at the position that
   predicts the token), each data-parallel rank on its share of the samples, then summed over the
   data-parallel group so every rank has all of them;
2. ``loss.advantages`` on the whole batch (identical on every rank; PPO's returns too);
3. one optimizer update per ``--global-batch-size`` samples (default: one per step): megatron's
   ``get_forward_backward_func`` over this rank's micro-batches, gradients accumulated by megatron's
   ``DistributedDataParallel`` into ``param.main_grad`` and reduced over data-parallel ranks, then
   the optimizer from ``get_megatron_optimizer`` (Adam; distributed with
   ``--megatron-use-distributed-optimizer``) after clipping to ``--clip-grad``. With a critic, each
   update trains the policy on ``loss.policy_loss`` and then the critic, the same way with its own
   model, optimizer and LR schedule (``--critic-lr``, the policy's schedule shape), on
   ``loss.value_loss``; for the first ``--critic-warmup-steps`` steps only the critic is trained
   (``train/policy_updated`` is 0, ``train/updates`` counts policy updates). The critic reports
   ``train/value_loss`` (and the loss's other metrics), ``train/critic_grad_norm``,
   ``train/critic_lr``, ``train/critic_skipped_updates``, and on the step's values before the
   update ``train/value_mean``, ``train/returns_mean``, ``train/explained_variance``.

The loss of a micro-batch is ``loss.policy_loss`` (the critic's: ``loss.value_loss``) of its rows,
normalised by the update's totals over all data-parallel ranks; megatron is told so
(``calculate_per_token_loss`` with no further scaling), so the summed gradient equals one big
batch's.

A bad step is refused whole, weights, optimizer state, LR schedules and counters as they were
(:mod:`plasmid_torch.step_guard`): an update whose summed loss is not finite, whose gradients
megatron finds non-finite (``found_inf``, fp16) or whose gradient norm is not finite is not applied
(``train/bad_step/nonfinite_loss``, ``.../nonfinite_grad_norm``, ``critic_``-prefixed for the
critic), and weights that are then non-finite or moved by more than ``--max-update-ratio`` times
their norm are put back from a copy of this rank's weights, main weights and optimizer state taken
when the step began (``.../nonfinite_weights``, ``.../weights_blew_up``).

Context parallelism (``--context-parallel-size`` > 1): the ranks of a context-parallel group share a
data-parallel rank's samples, each holding two of the ``2 * cp`` chunks of every sequence
(:mod:`plasmid_megatron.batching`); per-token log-probs and entropy are summed over the group, so the
loss is the same on each, and megatron sums the gradients over data-parallel x context-parallel ranks
(why that is exact: :mod:`plasmid_megatron.context_parallel`). It needs TransformerEngine's attention
(GPU); megatron-core's local attention refuses it, and so does the trainer, with a UsageError.

Learning rate: megatron's ``OptimizerParamScheduler``, stepped before each update, so update ``u``
(0-based) uses its value at ``u + 1``: warmup is ``lr * (u + 1) / warmup`` (as the torch trainer),
decay reaches ``--min-lr`` at the last update. Weight decay skips biases and norms (megatron's rule).

Checkpoints (``save``/``load``): a Hugging Face ``model/`` of the policy for engines and
``--model``, and a megatron-core distributed checkpoint of the policy and critic (weights, optimizer
state, LR schedules) and the counters, which resumes in any parallel layout
(:mod:`plasmid_megatron.checkpoint`, :mod:`plasmid_megatron.sharded_state`).

All torch and megatron work runs on one thread, the process's compute thread
(:mod:`plasmid_torch.compute`, shared with an engine in the same process; CUDA's current device and
megatron's state are per thread or global); the async methods await it, so an event loop shared
with engines keeps serving. Without CUDA, megatron-core's optimizer and RNG tracker call CUDA; that
is refused with an explanation unless the process was prepared for it (only the tests do, with
``tests/megatron_cpu_shim.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions, ScheduleOptions
from plasmid.options import Options
from plasmid.protocols import Loss
from plasmid.types import LossBatch, RolloutBatch, Sample
from plasmid_megatron import batching, checkpoint, hf_export, moe, offload, passes, routing_replay, sharded_state
from plasmid_megatron.context_parallel import check_attention, sum_over_context_parallel
from plasmid_megatron.converter import Converter
from plasmid_megatron.critic import MegatronCritic, critic_lr_settings
from plasmid_megatron.model import (
    build_gpt_model,
    export_hf_weights,
    hf_tensor_reader,
    in_training_precision,
    load_hf_weights,
    params_dtype,
    transformer_config,
    with_dtypes,
)
from plasmid_megatron.model_spec import UnsupportedModel, read_model_spec
from plasmid_megatron.native_options import check_against, native_values
from plasmid_megatron.options import MegatronOptions
from plasmid_megatron.parallel import (
    ParallelSizes,
    all_reduce_sum,
    broadcast_object,
    current_groups,
    device,
    init_model_parallel,
)
from plasmid_megatron.vocab_parallel import vocab_parallel_logprobs
from plasmid_torch.compute import compute_executor
from plasmid_torch.step_guard import TorchSnapshot, loss_and_grad_problem, refusal
from plasmid_torch.train_step import CriticParts, StepCounters, TrainerParts, TrainStep
from plasmid_torch.trainer_options import TrainerOptions
from plasmid_torch.training import check_samples, check_trainer_setup, scheduled_updates

NO_CUDA_HINT = ("megatron-core needs CUDA here (its optimizer, RNG tracker and schedules allocate on the GPU), and "
                "this torch has no CUDA device. Run the megatron trainer on a GPU machine; on CPU only the plugin's "
                "tests run it, after patching megatron (plugins/trainers/megatron/tests/megatron_cpu_shim.py)")


class MegatronTrainer(StepCounters):
    """The ``megatron`` trainer; built by the kernel as ``MegatronTrainer(config, loss)``.

    Implements :class:`plasmid.protocols.Trainer`. In a world of several ranks every method is
    collective: call it on every rank, in the same order, with the same arguments.
    Also reads every ``--megatron-*`` option given (see :mod:`plasmid_megatron.native_options`).
    """

    #: every method is a collective over the trainer's ranks (see :class:`plasmid.protocols.Trainer`)
    collective = True

    option_classes: ClassVar[tuple[type[Options], ...]] = (TrainerOptions, MegatronOptions, GeneralOptions,
                                                            RolloutOptions, ScheduleOptions)

    def __init__(self, config: Config, loss: Loss) -> None:
        general = GeneralOptions.of(config)
        check_trainer_setup("megatron", general, loss)
        self.config = config
        self.loss = loss
        #: the run's typed options: the trainers' shared group, this plugin's, the kernel's
        self.options = TrainerOptions.of(config)
        self.megatron_options = megatron = MegatronOptions.of(config)
        self.rollout_options = RolloutOptions.of(config)
        self.seed = general.seed
        self.model_dir = Path(general.model)
        self.temperature: float = self.rollout_options.temperature
        self.micro_batch_size: int = self.options.micro_batch_size
        self.max_tokens_per_micro_batch: int | None = self.options.max_tokens_per_micro_batch
        self.sizes = ParallelSizes(megatron.tensor_model_parallel_size, megatron.pipeline_model_parallel_size,
                                   megatron.context_parallel_size, megatron.expert_model_parallel_size)
        self.native = native_values(config.option)
        self.sizes = replace(self.sizes, etp=self.native["TransformerConfig"].get("expert_tensor_parallel_size"))
        try:
            self.spec = read_model_spec(self.model_dir)
        except UnsupportedModel as exc:
            raise UsageError(f"megatron: {exc}") from None
        if self.sizes.ep > 1 and not self.spec.is_moe:
            raise UsageError(f"megatron: --expert-model-parallel-size {self.sizes.ep} needs a mixture-of-experts "
                             f"model (qwen2_moe, qwen3_moe); {self.model_dir} is a dense {self.spec.family} model: "
                             f"use --expert-model-parallel-size 1")
        check_attention(self.spec, self.sizes, self.native["TransformerConfig"])   # CP > 1: TransformerEngine's
        #: ``--routing-replay`` (:mod:`plasmid_megatron.routing_replay`); its per-step state, built with the model
        self.routing_replay_mode: str = megatron.routing_replay
        self.step_routing: routing_replay.StepRouting | None = None
        if self.routing_replay_mode != "none":
            if not self.spec.is_moe:
                raise UsageError(f"megatron: --routing-replay {self.routing_replay_mode} needs a mixture-of-experts "
                                 f"model (qwen2_moe, qwen3_moe); {self.model_dir} is a dense {self.spec.family} "
                                 f"model: use --routing-replay none")
            if (self.sizes.tp, self.sizes.pp, self.sizes.cp) != (1, 1, 1):
                raise UsageError(f"megatron: --routing-replay {self.routing_replay_mode} is implemented for "
                                 f"tensor/pipeline/context-parallel sizes 1 (data and expert parallelism: any; got "
                                 f"{self.sizes.tp}/{self.sizes.pp}/{self.sizes.cp}); use --routing-replay none")
        #: the critic (:mod:`plasmid_megatron.critic`), built when the loss needs_critic; else None.
        self.critic: MegatronCritic | None = None
        #: the process's compute thread (plasmid_torch.compute): all torch and megatron work runs on it
        self._worker = compute_executor()
        self._run(self._build)
        critic_parts = None
        if self.critic is not None:
            critic_parts = CriticParts(values=self._step_values, update=self._critic_update)
        #: the train-step recipe, with this trainer's parts; it keeps the step and update counters
        self.recipe = TrainStep(TrainerParts(loss=loss, policy=self.model, reference=self.ref_model,
                                             logprobs=self._step_logprobs, policy_update=self._update,
                                             critic=critic_parts, device=self.device, snapshot=self._snapshot),
                                self.options, temperature=self.temperature)

    # ---------------------------------------------------------------------------------------------
    # Trainer protocol
    # ---------------------------------------------------------------------------------------------

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        """Log-probs of each sample's response tokens (``[response_length]`` each) under the
        current policy at ``temperature``; masked tokens included."""
        return await self._arun(self.compute_logprobs, samples, temperature)

    async def values(self, samples: list[Sample]) -> list[list[float]]:
        """The critic's value of each response token's state (``[response_length]`` each, read at
        the position that predicts the token); only when the loss needs a critic."""
        return await self._arun(self.compute_values, samples)

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One RL step on ``batch`` (see the module docstring); ``train/...`` float metrics."""
        return await self._arun(self.recipe.run, batch)

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's weights in Hugging Face names (each once; a tied ``lm_head`` and the
        vocabulary padding left out), as CPU copies in buckets of at most ``bucket_bytes`` bytes
        (a larger tensor alone). Collective over the model-parallel ranks: every rank iterates it."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes} (--update-weight-buffer-size)")
        # lazily: one bucket (and the tensor after it) at a time, never a full copy (plasmid_megatron.hf_export)
        yield from hf_export.buckets(self._on_worker(lambda: export_hf_weights(self.model, self.converter,
                                                                                self.groups)), bucket_bytes)

    async def save(self, path: str) -> None:
        """Write checkpoint directory ``path``, atomically (layout in :mod:`plasmid_megatron.checkpoint`):
        the policy as a Hugging Face model in ``model/``, and a megatron distributed checkpoint of
        the policy's and the critic's weights, optimizer and scheduler state and the counters."""
        await self._arun(self.save_checkpoint, path)

    async def load(self, path: str) -> None:
        """Restore weights, optimizer, scheduler and counters (policy and critic) from checkpoint
        ``path``, which may have been written in another parallel layout; the random generators too
        when the layout is the same."""
        await self._arun(self.load_checkpoint, path)

    async def offload(self) -> None:
        """On CUDA: free the device memory of the weights (policy, reference, critic), their
        optimizer state and gradient buffers; weights and optimizer state wait in pinned host
        memory (:mod:`plasmid_megatron.offload`), so colocated engines get the memory. Without CUDA
        there is nothing to free: a no-op."""
        await self._arun(self._offload)

    async def onload(self) -> None:
        """Undo :meth:`offload`: every tensor back in place, gradients zero (a no-op without CUDA)."""
        await self._arun(self._onload)

    # ---------------------------------------------------------------------------------------------
    # building
    # ---------------------------------------------------------------------------------------------

    def _build(self) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        options = self.options
        init_model_parallel(self.sizes, self.seed)
        self.groups = current_groups()
        self.device = device()
        padded = self.spec.padded_vocab_size(self.megatron_options.make_vocab_size_divisible_by, self.sizes.tp)
        try:
            self.converter = Converter(self.spec, self.sizes.tp, padded, ep_size=self.sizes.ep,
                                       etp_size=self.sizes.expert_tp)
            native_config = self.native["TransformerConfig"]
            if self.routing_replay_mode != "none":
                native_config = {**native_config, **routing_replay.CONFIG_KWARGS}
            self.transformer_config = transformer_config(self.spec, self.sizes, native_config)
        except ValueError as exc:
            raise UsageError(f"megatron: {exc}") from None
        read = hf_tensor_reader(self.model_dir)
        model = build_gpt_model(self.spec, self.transformer_config, padded)
        load_hf_weights(model, self.converter, read, self.groups.tp_rank)
        model = in_training_precision(model, self.transformer_config)

        ddp_values = self.native["DistributedDataParallelConfig"]
        check_against(DistributedDataParallelConfig, ddp_values)
        self.model = DistributedDataParallel(self.transformer_config, DistributedDataParallelConfig(**ddp_values),
                                             model)
        self.transformer_config.no_sync_func = self.model.no_sync
        if self.routing_replay_mode != "none":
            self.step_routing = routing_replay.StepRouting(self.model, self.routing_replay_mode,
                                                           self.groups.dp_group, self.groups.dp_size)
        self.transformer_config.finalize_model_grads_func = _finalize_model_grads

        optimizer_values = with_dtypes(self.native["OptimizerConfig"])
        check_against(OptimizerConfig, optimizer_values)
        dtype = params_dtype(self.native["TransformerConfig"])
        optimizer_config = OptimizerConfig(**{
            "optimizer": "adam", "lr": options.lr, "min_lr": options.min_lr, "weight_decay": options.weight_decay,
            "adam_beta1": options.adam_beta1, "adam_beta2": options.adam_beta2, "clip_grad": options.clip_grad,
            "params_dtype": dtype, "bf16": dtype == torch.bfloat16, "fp16": dtype == torch.float16,
            **optimizer_values})
        self.optimizer = get_megatron_optimizer(optimizer_config, [self.model])
        self.scheduler = self._make_scheduler()

        self.ref_model = None
        if self.loss.needs_ref:
            reference = build_gpt_model(self.spec, self.transformer_config, padded)
            load_hf_weights(reference, self.converter, read, self.groups.tp_rank)
            reference = in_training_precision(reference, self.transformer_config)
            self.ref_model = reference.requires_grad_(False).eval()

        if self.loss.needs_critic:
            critic_lr, critic_min_lr = critic_lr_settings(options)
            self.critic = MegatronCritic(
                spec=self.spec, config=self.transformer_config, converter=self.converter, read=read,
                padded_vocab_size=padded, groups=self.groups, device=self.device,
                ddp_config=DistributedDataParallelConfig(**ddp_values),
                optimizer_config=replace(optimizer_config, lr=critic_lr, min_lr=critic_min_lr),
                make_scheduler=lambda optimizer: self._make_scheduler(optimizer, critic_lr, critic_min_lr))

        #: device memory of everything above, freed by offload() and restored by onload()
        self.memory = offload.MemoryStash(self._device_state, device=self.device)

    def _make_scheduler(self, optimizer: Any = None, lr: float | None = None, min_lr: float | None = None) -> Any:
        """The LR schedule of ``optimizer`` (the policy's when not given) from ``lr`` to ``min_lr``
        (the policy's ``--lr``, ``--min-lr`` when not given), shaped by ``--lr-schedule`` and
        ``--lr-warmup-steps`` over the run's :func:`~plasmid_torch.training.scheduled_updates`."""
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        options = self.options
        total = scheduled_updates(options, self.rollout_options)
        warmup = options.lr_warmup_steps
        lr = options.lr if lr is None else lr
        min_lr = options.min_lr if min_lr is None else min_lr
        optimizer = self.optimizer if optimizer is None else optimizer
        return OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=lr, min_lr=min_lr,
                                       lr_warmup_steps=warmup, lr_decay_steps=max(total, warmup + 1),
                                       lr_decay_style=options.lr_schedule, start_wd=options.weight_decay,
                                       end_wd=options.weight_decay, wd_incr_steps=1, wd_incr_style="constant")

    # ---------------------------------------------------------------------------------------------
    # the worker thread
    # ---------------------------------------------------------------------------------------------

    def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        return self._worker.submit(_explained, function, *args).result()

    async def _arun(self, function: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(self._worker.submit(_explained, function, *args))

    def _on_worker(self, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """Iterate the iterator ``make()`` returns, each step on the worker thread."""
        iterator = self._run(make)
        done = object()
        while True:
            item = self._run(next, iterator, done)
            if item is done:
                return
            yield item

    # ---------------------------------------------------------------------------------------------
    # log-probs
    # ---------------------------------------------------------------------------------------------

    def compute_logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        if not samples:
            return []
        check_samples(samples)
        width = max(s.response_length for s in samples)
        values = self._forward_logprobs(self.model, samples, range(len(samples)), width, temperature)
        return [values[row, : sample.response_length].tolist() for row, sample in enumerate(samples)]

    def compute_values(self, samples: list[Sample]) -> list[list[float]]:
        if self.critic is None:
            raise ValueError(f"megatron: the loss {type(self.loss).__name__} has no critic (needs_critic is false): "
                             f"there are no values to compute")
        if not samples:
            return []
        check_samples(samples)
        width = max(s.response_length for s in samples)
        values = self._critic_values(samples, range(len(samples)), width)
        return [values[row, : sample.response_length].tolist() for row, sample in enumerate(samples)]

    def _critic_values(self, samples: Sequence[Sample], rows: Sequence[int], width: int) -> torch.Tensor:
        """``[len(samples), width]`` float32 CPU critic values of ``rows``, identical on every rank."""
        return self.critic.values(self._micro_batches(samples, rows, width), len(samples), width)

    def _forward_logprobs(self, model: Any, samples: Sequence[Sample], rows: Sequence[int], width: int,
                          temperature: float, around: Any = None) -> torch.Tensor:
        """``[len(samples), width]`` float32 CPU log-probs of ``rows`` (zeros elsewhere and beyond each
        response), without gradient, identical on every rank."""
        def read(logits: torch.Tensor, micro: batching.MicroBatch) -> torch.Tensor:
            return self._logprobs_of(logits, micro, temperature, with_entropy=False)[0]

        return passes.forward_rows(model, self._micro_batches(samples, rows, width), len(samples), width, read,
                                   self.groups, self.device, around)

    def _logprobs_of(self, logits: torch.Tensor, micro: batching.MicroBatch, temperature: float, *,
                     with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[b, T]`` log-probs (and entropy) of the micro-batch's response tokens from this rank's
        ``[b, s, V_local]`` logits, zero beyond each response. With context parallelism each rank
        computes the tokens whose predicting position it holds and the results are summed over the
        context-parallel group, so every rank returns all of them (:mod:`plasmid_megatron.context_parallel`)."""
        local_vocab = logits.shape[-1]
        picked = logits.gather(1, micro.predicting.unsqueeze(-1).expand(-1, -1, local_vocab))     # [b, T, V_local]
        logprobs, entropy = vocab_parallel_logprobs(
            picked, micro.targets, temperature=temperature, vocab_start=self.groups.tp_rank * local_vocab,
            vocab_size=self.spec.vocab_size, tp_group=self.groups.tp_group, tp_size=self.groups.tp_size,
            with_entropy=with_entropy)
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        here = micro.in_response & micro.held
        logprobs = sum_over_context_parallel(torch.where(here, logprobs, zero), self.groups.cp_group,
                                             self.groups.cp_size)
        if entropy is not None:
            entropy = sum_over_context_parallel(torch.where(here, entropy, zero), self.groups.cp_group,
                                                self.groups.cp_size)
        return logprobs, entropy

    def _micro_batches(self, samples: Sequence[Sample], rows: Sequence[int], width: int) -> list[batching.MicroBatch]:
        """This data-parallel rank's micro-batches of ``rows`` (this context-parallel rank's chunks of
        them); a rank without rows gets one stand-in micro-batch (``counts=False``) so that it still
        takes part in every collective."""
        lengths = [len(s.tokens) for s in samples]
        mine = batching.shard_for_data_parallel(lengths, rows, self.groups.dp_size)[self.groups.dp_rank]
        plans = batching.plan_micro_batches(lengths, mine, micro_batch_size=self.micro_batch_size,
                                            max_tokens=self.max_tokens_per_micro_batch)
        pad_to = self.groups.tp_size if self.transformer_config.sequence_parallel else 1
        make = functools.partial(batching.make_micro_batch, samples, width=width, pad_id=0, pad_to=pad_to,
                                 cp_size=self.groups.cp_size, cp_rank=self.groups.cp_rank)
        made = [make(plan) for plan in plans]
        if not made:
            made = [make([rows[0]], counts=False)]
        if self.groups.ep_size > 1:     # expert-parallel ranks exchange tokens in every forward pass
            most = moe.most_micro_batches(lengths, rows, self.groups.dp_size, micro_batch_size=self.micro_batch_size,
                                          max_tokens=self.max_tokens_per_micro_batch)
            made += [make([rows[0]], counts=False) for _ in range(most - len(made))]
        return [micro.to(self.device) for micro in made]

    # ---------------------------------------------------------------------------------------------
    # training
    # ---------------------------------------------------------------------------------------------

    def _step_logprobs(self, model: Any, samples: Sequence[Sample], temperature: float) -> torch.Tensor:
        """The recipe's ``logprobs`` part: ``[B, T]`` float32 CPU log-probs of every sample, on every rank."""
        width = max(s.response_length for s in samples)
        around = None
        if self.step_routing is not None and model is self.model:      # R2 records the step's routing, R3 replays
            routing, lengths = self.step_routing, [len(sample.tokens) for sample in samples]
            routing.recording_pass(samples)

            def around(micro: batching.MicroBatch) -> Any:
                return routing.old_pass(micro, lengths)
        return self._forward_logprobs(model, samples, range(len(samples)), width, temperature, around)

    def _step_values(self, samples: Sequence[Sample]) -> torch.Tensor:
        """The recipe's critic ``values`` part: ``[B, T]`` float32 CPU values of every sample, on every rank."""
        return self._critic_values(samples, range(len(samples)), max(s.response_length for s in samples))

    def _update(self, step_batch: LossBatch, samples: Sequence[Sample], chunk: list[int]) -> dict[str, float]:
        """One optimizer update on the samples ``chunk``; ``step_batch`` (the whole step's rows)
        carries the chunk's totals, by which each micro-batch loss is normalised."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        width = int(step_batch.response_mask.shape[1])
        micro_batches = self._micro_batches(samples, chunk, width)
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator: Iterator[batching.MicroBatch], chunk_model: Any) -> tuple[Any, Callable]:
            micro = next(data_iterator)
            with (self.step_routing.replay(micro, samples) if self.step_routing is not None
                  else contextlib.nullcontext()):
                output = chunk_model(micro.input_ids, micro.position_ids, None)
            return output, functools.partial(self._micro_loss, micro, step_batch)

        outputs = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[self.model],
            num_microbatches=len(micro_batches), seq_length=max(m.length for m in micro_batches),
            micro_batch_size=max(m.size for m in micro_batches), forward_only=False)
        totals = self._reduced_metrics(outputs)
        return {**totals, **self._optimizer_step(totals["loss"])}

    def _critic_update(self, step_batch: LossBatch, samples: Sequence[Sample], chunk: list[int]) -> dict[str, float]:
        """One critic optimizer update on the samples ``chunk`` (:meth:`MegatronCritic.update`)."""
        micro_batches = self._micro_batches(samples, chunk, int(step_batch.response_mask.shape[1]))
        return self.critic.update(micro_batches, step_batch, self.loss, reduce_metrics=self._reduced_metrics,
                                  optimizer_step=functools.partial(self._optimizer_step, prefix="critic_"))

    def _micro_loss(self, micro: batching.MicroBatch, step_batch: LossBatch,
                    logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """The loss plugin's loss of one micro-batch (megatron's ``loss_func``)."""
        logprobs, entropy = self._logprobs_of(logits, micro, self.temperature, with_entropy=True)
        rows = step_batch.select(micro.rows.to(self.device))
        if not micro.counts:
            rows = replace(rows, response_mask=torch.zeros_like(rows.response_mask))
        value, metrics = self.loss.policy_loss(rows, logprobs, entropy)
        if not micro.counts:
            value = value * 0.0
            metrics = dict.fromkeys(metrics, 0.0)
        reported = {"loss": float(value.detach()), **{name: float(metric) for name, metric in metrics.items()}}
        return value, passes.no_tokens(self.device), reported

    def _reduced_metrics(self, outputs: list[dict[str, float]]) -> dict[str, float]:
        """Micro-batch metrics summed over micro-batches and data-parallel ranks (they are
        normalised by the update's totals), from the last pipeline stage to every rank. Not over
        context-parallel ranks: they all computed the same loss and metrics of the same samples."""
        names = sorted({name for output in outputs for name in output}) if self.groups.last_stage else None
        names = broadcast_object(names, self.groups.pp_last_rank, self.groups.pp_group, self.groups.pp_size)
        sums = torch.zeros(len(names), dtype=torch.float64)
        if self.groups.last_stage:
            for output in outputs:
                sums += torch.tensor([output.get(name, 0.0) for name in names], dtype=torch.float64)
        sums = sums.to(self.device)
        all_reduce_sum(sums, self.groups.pp_group, self.groups.pp_size)
        all_reduce_sum(sums, self.groups.dp_group, self.groups.dp_size)
        return dict(zip(names, sums.cpu().tolist(), strict=True))

    def _optimizer_step(self, loss: float, optimizer: Any = None, scheduler: Any = None, *,
                        prefix: str = "") -> dict[str, float]:
        """Clip and apply the accumulated gradients of ``optimizer`` after stepping ``scheduler``
        (default: the policy's; the critic passes its own); ``loss`` is the update's loss summed
        over micro-batches and ranks. Returns ``<prefix>grad_norm`` (before clipping),
        ``<prefix>lr`` and ``<prefix>skipped_updates`` (0.0).

        Megatron's ``ChainedOptimizer.step`` in its parts, so that a bad update is refused before
        anything moves. Under fp16 with a dynamic loss scale, megatron's ``found_inf`` is the
        scaler backing off (routine while the scale settles): the update is skipped as megatron
        would (``<prefix>skipped_updates`` 1.0, schedule unstepped), not reported as a bad step.
        A non-finite ``loss``, ``found_inf`` under a constant loss scale or a non-finite gradient
        norm clear the gradients, leave optimizer and schedule as they were and return
        ``bad_step/<prefix>nonfinite_loss`` or ``bad_step/<prefix>nonfinite_grad_norm``
        (:mod:`plasmid_torch.step_guard`); every rank decides alike (the values are all-reduced)."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        optimizer = self.optimizer if optimizer is None else optimizer
        scheduler = self.scheduler if scheduler is None else scheduler
        if not math.isfinite(loss):
            return self._refuse(optimizer, f"{prefix}nonfinite_loss")
        if optimizer.prepare_grads():          # megatron's found_inf: fp16 loss scaling found an overflow
            if _dynamic_loss_scaling(optimizer):  # the scaler backed off: routine in fp16, not a bad step
                optimizer.zero_grad()
                return {f"{prefix}lr": float(optimizer.param_groups[0]["lr"]), f"{prefix}skipped_updates": 1.0}
            return self._refuse(optimizer, f"{prefix}nonfinite_grad_norm")
        grad_norm = float(optimizer.get_grad_norm())
        problem = loss_and_grad_problem(loss, grad_norm, prefix=prefix)
        if problem is not None:
            return self._refuse(optimizer, problem)
        scheduler.step(1)
        lr = float(optimizer.param_groups[0]["lr"])
        for part in getattr(optimizer, "chained_optimizers", [optimizer]):
            parameters = part.get_parameters()
            if parameters and part.config.clip_grad > 0.0:
                clip_grad_by_total_norm_fp32(parameters, max_norm=part.config.clip_grad, total_norm=grad_norm,
                                             use_decoupled_grad=_decoupled_grad(part.config))
        optimizer.step_with_ready_grads()
        return {f"{prefix}grad_norm": grad_norm, f"{prefix}lr": lr, f"{prefix}skipped_updates": 0.0}

    @staticmethod
    def _refuse(optimizer: Any, reason: str) -> dict[str, float]:
        optimizer.zero_grad()
        return refusal(reason)

    def _snapshot(self) -> TorchSnapshot:
        """What a step changes, to put back when it is refused (:class:`plasmid_torch.step_guard.TorchSnapshot`):
        this rank's trained weights of the policy (and critic), the torch optimizers inside
        megatron's with their fp32 main weights and state, and the LR schedules; the weight
        check's answer is agreed over every rank of the world."""
        models = [self.model] + ([self.critic.model] if self.critic is not None else [])
        optimizers = [self.optimizer] + ([self.critic.optimizer] if self.critic is not None else [])
        schedulers = [self.scheduler] + ([self.critic.scheduler] if self.critic is not None else [])
        inner = [torch_optimizer for optimizer in optimizers for torch_optimizer in _torch_optimizers(optimizer)]
        main = [p for torch_optimizer in inner for group in torch_optimizer.param_groups for p in group["params"]]
        trained = [p for model in models for p in model.parameters() if p.requires_grad]
        return TorchSnapshot(trained, optimizers=inner, schedulers=schedulers, tensors=main, agree=self._any_rank)

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank of the world (all-reduce MAX)."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    # ---------------------------------------------------------------------------------------------
    # checkpoints, offload
    # ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Write checkpoint ``path`` (layout: :mod:`plasmid_megatron.checkpoint`): the policy's
        Hugging Face export, and one megatron distributed checkpoint of the policy's (and the
        critic's) weights, optimizer and scheduler state, with the counters and this layout."""
        state = sharded_state.sharded_state_dict(self._trainables(), self._saved_counters(), loading=False)
        checkpoint.write(path, hf_tensors=export_hf_weights(self.model, self.converter, self.groups),
                         model_dir=self.model_dir, sharded_state=state, rng=checkpoint.rng_state(),
                         shard_bytes=ScheduleOptions.of(self.config).update_weight_buffer_size)

    @torch.no_grad()
    def load_checkpoint(self, path: str) -> None:
        """Resume from checkpoint ``path``, written in this or any other parallel layout (megatron
        reshards it); the random generators only when the layout is the same (else each rank keeps
        its ``--seed`` states)."""
        trainables = self._trainables()
        sharded_state.check_saved(checkpoint.read_common(path), trainables, path)
        wanted = sharded_state.sharded_state_dict(trainables, {}, loading=True)
        runtime = sharded_state.runtime_values(wanted)
        saved = sharded_state.restore(trainables, runtime, checkpoint.read(path, wanted))
        self.recipe.restore(saved)
        if saved["layout"] == self._layout():
            checkpoint.set_rng_state(checkpoint.read_rng(path))

    def _trainables(self) -> list[sharded_state.Trainable]:
        """What a checkpoint saves and resumes: the policy, and the critic when there is one."""
        parts = [sharded_state.Trainable("policy", self.model, self.optimizer, self.scheduler)]
        if self.critic is not None:
            parts.append(sharded_state.Trainable("critic", self.critic.model, self.critic.optimizer,
                                                 self.critic.scheduler))
        return parts

    def _saved_counters(self) -> dict[str, Any]:
        return {**self.recipe.counters(), "layout": self._layout(),
                "parts": sharded_state.describe(self._trainables())}

    def _layout(self) -> dict[str, int]:
        return {"world": dist.get_world_size(), "tp": self.groups.tp_size, "pp": self.groups.pp_size,
                "dp": self.groups.dp_size, "ep": self.groups.ep_size, "etp": self.groups.etp_size}

    def _offload(self) -> None:
        if self.device.type != "cuda":
            return
        torch.cuda.synchronize()
        self.memory.offload()
        torch.cuda.empty_cache()

    def _onload(self) -> None:
        if self.device.type != "cuda":
            return
        self.memory.onload()
        torch.cuda.synchronize()

    def _device_state(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """``(kept, discarded)`` tensors of :attr:`memory`: the weights of the policy, reference
        and critic and their optimizers' state; their gradient buffers."""
        ddp_models = [self.model] + ([self.critic.model] if self.critic is not None else [])
        optimizers = [self.optimizer] + ([self.critic.optimizer] if self.critic is not None else [])
        models = ddp_models + ([self.ref_model] if self.ref_model is not None else [])
        kept = [param for model in models for param in model.parameters()]
        kept += [tensor for optimizer in optimizers for tensor in offload.optimizer_tensors(optimizer)]
        return kept, [buffer for model in ddp_models for buffer in offload.grad_buffers(model)]


# -------------------------------------------------------------------------------------------------


def _finalize_model_grads(model: list[Any], num_tokens: Any = None, **kwargs: Any) -> None:
    """megatron's ``finalize_model_grads`` without its division by the number of tokens: our
    losses are already normalised by the update's totals."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model, None, **kwargs)


def _explained(function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function``; a failure from calling CUDA on a machine without it becomes a UsageError."""
    try:
        return function(*args)
    except (AssertionError, RuntimeError) as exc:
        text = str(exc)
        if not torch.cuda.is_available() and ("CUDA" in text or "NVIDIA driver" in text):
            raise UsageError(f"{NO_CUDA_HINT} ({type(exc).__name__}: {text})") from exc
        raise


def _torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside a megatron optimizer (a ``ChainedOptimizer`` of parts, each with
    its ``optimizer``; a stub part has none)."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    return [part.optimizer for part in parts if isinstance(getattr(part, "optimizer", None), torch.optim.Optimizer)]


def _decoupled_grad(optimizer_config: Any) -> bool:
    """Whether megatron keeps this optimizer's gradients in ``decoupled_grad`` (precision-aware optimizer)."""
    return bool(getattr(optimizer_config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8",
                        getattr(optimizer_config, "use_precision_aware_optimizer", False)))


def _dynamic_loss_scaling(optimizer: Any) -> bool:
    """Whether ``optimizer`` (or a part of a chained one) scales fp16 losses dynamically, so that
    an overflow only lowers the scale (megatron's ``DynamicGradScaler``)."""
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    parts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return any(isinstance(getattr(part, "grad_scaler", None), DynamicGradScaler) for part in parts)
