"""The megatron trainer: a Hugging Face causal LM trained as a megatron-core ``GPTModel`` with the run's loss.

Options read: ``--model`` (the policy, and the frozen reference when the loss needs one),
``--temperature`` (log-probs at the sampling temperature, as the engine reports them), ``--seed``,
the "training" group (``--lr``, ``--lr-schedule``, ``--lr-warmup-steps``, ``--min-lr``,
``--weight-decay``, ``--adam-beta1/2``, ``--clip-grad``, ``--global-batch-size``,
``--micro-batch-size``), ``--num-rollouts`` (length of the LR schedule), and this plugin's group:
the parallel sizes, ``--max-tokens-per-micro-batch``, ``--make-vocab-size-divisible-by`` and the
native ``--megatron-*`` fields (:mod:`plasmid_megatron.native_options`).

How a step runs (every rank of the trainer's world calls the same methods with the same batch):

1. log-probs of the policy before the update (and of the reference), each data-parallel rank on its
   share of the samples, then summed over the data-parallel group so every rank has all of them;
2. ``loss.advantages`` on the whole batch (identical on every rank);
3. one optimizer update per ``--global-batch-size`` samples (default: one per step): megatron's
   ``get_forward_backward_func`` over this rank's micro-batches, gradients accumulated by megatron's
   ``DistributedDataParallel`` into ``param.main_grad`` and reduced over data-parallel ranks, then
   the optimizer from ``get_megatron_optimizer`` (Adam; distributed with
   ``--megatron-use-distributed-optimizer``) after clipping to ``--clip-grad``.

The loss of a micro-batch is ``loss.policy_loss`` of its rows, normalised by the update's totals over
all data-parallel ranks; megatron is told so (``calculate_per_token_loss`` with no further scaling),
so the summed gradient equals one big batch's. An update whose gradient norm is not finite is skipped.

Learning rate: megatron's ``OptimizerParamScheduler``, stepped before each update, so update ``u``
(0-based) uses its value at ``u + 1``: warmup is ``lr * (u + 1) / warmup`` (as the torch trainer),
decay reaches ``--min-lr`` at the last update. Weight decay skips biases and norms (megatron's rule).

All torch and megatron work runs on one worker thread owned by the trainer (CUDA's current device
and megatron's state are per thread or global); the async methods await it, so an event loop shared
with engines keeps serving. Without CUDA, megatron-core's optimizer and RNG tracker call CUDA; that
is refused with an explanation unless the process was prepared for it (only the tests do, with
``tests/megatron_cpu_shim.py``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from plasmid.errors import UsageError
from plasmid.training import batch_metrics, check_samples, updates_per_rollout
from plasmid.types import LossBatch, RolloutBatch, Sample
from plasmid_megatron import batching, checkpoint
from plasmid_megatron.converter import Converter
from plasmid_megatron.model import (
    build_gpt_model,
    export_hf_weights,
    hf_tensor_reader,
    load_hf_weights,
    params_dtype,
    transformer_config,
    with_dtypes,
)
from plasmid_megatron.model_spec import UnsupportedModel, read_model_spec
from plasmid_megatron.native_options import check_against, native_values
from plasmid_megatron.parallel import (
    ParallelSizes,
    all_reduce_sum,
    broadcast_object,
    current_groups,
    device,
    init_model_parallel,
)
from plasmid_megatron.vocab_parallel import vocab_parallel_logprobs

NO_CUDA_HINT = ("megatron-core needs CUDA here (its optimizer, RNG tracker and schedules allocate on the GPU), and "
                "this torch has no CUDA device. Run the megatron trainer on a GPU machine; on CPU only the plugin's "
                "tests run it, after patching megatron (plugins/trainers/megatron/tests/megatron_cpu_shim.py)")


class MegatronTrainer:
    """The ``megatron`` trainer; built by the kernel as ``MegatronTrainer(config, loss)``.

    Implements :class:`plasmid.protocols.Trainer`. In a world of several ranks every method is
    collective: call it on every rank, in the same order, with the same arguments.
    Also reads every ``--megatron-*`` option given (see :mod:`plasmid_megatron.native_options`).
    """

    reads_options = ("model", "temperature", "seed", "lr", "lr_schedule", "lr_warmup_steps", "min_lr",
                     "weight_decay", "adam_beta1", "adam_beta2", "clip_grad", "global_batch_size", "micro_batch_size",
                     "num_rollouts", "prompts_per_step", "n_samples_per_prompt", "tensor_model_parallel_size",
                     "pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                     "max_tokens_per_micro_batch", "make_vocab_size_divisible_by")

    def __init__(self, config: Any, loss: Any) -> None:
        option = config.option
        if not option.model:
            raise UsageError("megatron: --model is not set; give a local Hugging Face model directory")
        if getattr(loss, "needs_critic", False):
            raise UsageError(f"megatron: the loss {type(loss).__name__} needs a critic (needs_critic), which this "
                             f"trainer does not build yet; choose another --loss")
        if option.context_parallel_size > 1 or option.expert_model_parallel_size > 1:
            raise UsageError("megatron: --context-parallel-size and --expert-model-parallel-size > 1 are not "
                             "supported yet (sequences are not split over context-parallel ranks, and no MoE model "
                             "family is converted)")
        self.config = config
        self.loss = loss
        self.model_dir = Path(option.model)
        self.temperature: float = option.temperature
        self.micro_batch_size: int = option.micro_batch_size
        self.max_tokens_per_micro_batch: int | None = option.max_tokens_per_micro_batch
        self.global_batch_size: int | None = option.global_batch_size
        self.sizes = ParallelSizes(option.tensor_model_parallel_size, option.pipeline_model_parallel_size,
                                   option.context_parallel_size, option.expert_model_parallel_size)
        self.native = native_values(option)
        try:
            self.spec = read_model_spec(self.model_dir)
        except UnsupportedModel as exc:
            raise UsageError(f"megatron: {exc}") from None
        #: train_step calls completed (RL steps trained on).
        self.steps = 0
        #: optimizer updates made (skipped ones included).
        self.updates = 0
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="plasmid-megatron")
        self._run(self._build)

    # ---------------------------------------------------------------------------------------------
    # Trainer protocol
    # ---------------------------------------------------------------------------------------------

    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        """Log-probs of each sample's response tokens (``[response_length]`` each) under the
        current policy at ``temperature``; masked tokens included."""
        return await self._arun(self.compute_logprobs, samples, temperature)

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        """One RL step on ``batch`` (see the module docstring); ``train/...`` float metrics."""
        return await self._arun(self.run_train_step, batch)

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's weights in Hugging Face names (each once; a tied ``lm_head`` and the
        vocabulary padding left out), as CPU copies in buckets of at most ``bucket_bytes`` bytes
        (a larger tensor alone). Collective over the model-parallel ranks: every rank iterates it."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes} (--update-weight-buffer-size)")
        stream = self._on_worker(lambda: export_hf_weights(self.model, self.converter, self.groups))
        pending: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in stream:
            nbytes = tensor.numel() * tensor.element_size()
            if pending and size + nbytes > bucket_bytes:
                yield pending
                pending, size = [], 0
            pending.append((name, tensor))
            size += nbytes
        if pending:
            yield pending

    async def save(self, path: str) -> None:
        """Write checkpoint directory ``path`` (layout in :mod:`plasmid_megatron.checkpoint`)."""
        await self._arun(self.save_checkpoint, path)

    async def load(self, path: str) -> None:
        """Restore weights, optimizer, scheduler, RNG and counters from checkpoint ``path``."""
        await self._arun(self.load_checkpoint, path)

    async def offload(self) -> None:
        """On CUDA: move the optimizer state and gradient buffers to the CPU (colocated engines
        get the memory). Without CUDA there is nothing to free: a no-op."""
        await self._arun(self._offload)

    async def onload(self) -> None:
        """Undo :meth:`offload` (a no-op without CUDA)."""
        await self._arun(self._onload)

    def close(self) -> None:
        """Stop the worker thread (megatron's process groups stay: they are process-global)."""
        self._worker.shutdown(wait=True)

    # ---------------------------------------------------------------------------------------------
    # building
    # ---------------------------------------------------------------------------------------------

    def _build(self) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        option = self.config.option
        init_model_parallel(self.sizes, option.seed)
        self.groups = current_groups()
        self.device = device()
        padded = self.spec.padded_vocab_size(option.make_vocab_size_divisible_by, self.sizes.tp)
        try:
            self.converter = Converter(self.spec, self.sizes.tp, padded)
            self.transformer_config = transformer_config(self.spec, self.sizes, self.native["TransformerConfig"])
        except ValueError as exc:
            raise UsageError(f"megatron: {exc}") from None
        read = hf_tensor_reader(self.model_dir)
        model = build_gpt_model(self.spec, self.transformer_config, padded)
        load_hf_weights(model, self.converter, read, self.groups.tp_rank)

        ddp_values = self.native["DistributedDataParallelConfig"]
        check_against(DistributedDataParallelConfig, ddp_values)
        self.model = DistributedDataParallel(self.transformer_config, DistributedDataParallelConfig(**ddp_values),
                                             model)
        self.transformer_config.no_sync_func = self.model.no_sync
        self.transformer_config.finalize_model_grads_func = _finalize_model_grads

        optimizer_values = with_dtypes(self.native["OptimizerConfig"])
        check_against(OptimizerConfig, optimizer_values)
        dtype = params_dtype(self.native["TransformerConfig"])
        optimizer_config = OptimizerConfig(**{
            "optimizer": "adam", "lr": option.lr, "min_lr": option.min_lr, "weight_decay": option.weight_decay,
            "adam_beta1": option.adam_beta1, "adam_beta2": option.adam_beta2, "clip_grad": option.clip_grad or 0.0,
            "params_dtype": dtype, "bf16": dtype == torch.bfloat16, "fp16": dtype == torch.float16,
            **optimizer_values})
        self.optimizer = get_megatron_optimizer(optimizer_config, [self.model])
        self.scheduler = self._make_scheduler(option)

        self.ref_model = None
        if self.loss.needs_ref:
            reference = build_gpt_model(self.spec, self.transformer_config, padded)
            load_hf_weights(reference, self.converter, read, self.groups.tp_rank)
            self.ref_model = reference.requires_grad_(False).eval()

    def _make_scheduler(self, option: Any) -> Any:
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        total = option.num_rollouts * updates_per_rollout(option)
        warmup = option.lr_warmup_steps
        return OptimizerParamScheduler(self.optimizer, init_lr=0.0, max_lr=option.lr, min_lr=option.min_lr,
                                       lr_warmup_steps=warmup, lr_decay_steps=max(total, warmup + 1),
                                       lr_decay_style=option.lr_schedule, start_wd=option.weight_decay,
                                       end_wd=option.weight_decay, wd_incr_steps=1, wd_incr_style="constant")

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

    def _forward_logprobs(self, model: Any, samples: Sequence[Sample], rows: Sequence[int], width: int,
                          temperature: float) -> torch.Tensor:
        """``[len(samples), width]`` float32 CPU log-probs of ``rows`` (zeros elsewhere and beyond each
        response), without gradient, identical on every rank."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micro_batches = self._micro_batches(samples, rows, width)
        model.eval()

        def forward_step(data_iterator: Iterator[batching.MicroBatch], chunk: Any) -> tuple[Any, Callable]:
            micro = next(data_iterator)
            output = chunk(micro.input_ids, micro.position_ids, None)

            def collect(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
                logprobs, _ = self._logprobs_of(logits, micro, temperature, with_entropy=False)
                return (logits.new_zeros(()), self._no_tokens(),
                        {"rows": micro.rows, "logprobs": logprobs.float().cpu(), "counts": micro.counts})

            return output, collect

        with torch.no_grad():
            outputs = get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[model],
                num_microbatches=len(micro_batches), seq_length=max(m.length for m in micro_batches),
                micro_batch_size=max(m.size for m in micro_batches), forward_only=True)
        values = torch.zeros((len(samples), width), dtype=torch.float32)
        if self.groups.last_stage:
            for output in outputs:
                if output["counts"]:
                    values[output["rows"]] = output["logprobs"]
        values = values.to(self.device)
        all_reduce_sum(values, self.groups.pp_group, self.groups.pp_size)   # other stages hold zeros
        all_reduce_sum(values, self.groups.dp_group, self.groups.dp_size)   # disjoint rows per rank
        return values.cpu()

    def _logprobs_of(self, logits: torch.Tensor, micro: batching.MicroBatch, temperature: float, *,
                     with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[b, T]`` log-probs (and entropy) of the micro-batch's response tokens from this rank's
        ``[b, s, V_local]`` logits, zero beyond each response."""
        local_vocab = logits.shape[-1]
        picked = logits.gather(1, micro.predicting.unsqueeze(-1).expand(-1, -1, local_vocab))     # [b, T, V_local]
        logprobs, entropy = vocab_parallel_logprobs(
            picked, micro.targets, temperature=temperature, vocab_start=self.groups.tp_rank * local_vocab,
            vocab_size=self.spec.vocab_size, tp_group=self.groups.tp_group, tp_size=self.groups.tp_size,
            with_entropy=with_entropy)
        zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        logprobs = torch.where(micro.in_response, logprobs, zero)
        if entropy is not None:
            entropy = torch.where(micro.in_response, entropy, zero)
        return logprobs, entropy

    def _micro_batches(self, samples: Sequence[Sample], rows: Sequence[int], width: int) -> list[batching.MicroBatch]:
        """This data-parallel rank's micro-batches of ``rows``; a rank without rows gets one
        stand-in micro-batch (``counts=False``) so that it still takes part in every collective."""
        lengths = [len(s.tokens) for s in samples]
        mine = batching.shard_for_data_parallel(lengths, rows, self.groups.dp_size)[self.groups.dp_rank]
        plans = batching.plan_micro_batches(lengths, mine, micro_batch_size=self.micro_batch_size,
                                            max_tokens=self.max_tokens_per_micro_batch)
        pad_to = self.groups.tp_size if self.transformer_config.sequence_parallel else 1
        made = [batching.make_micro_batch(samples, plan, width=width, pad_id=0, pad_to=pad_to) for plan in plans]
        if not made:
            made = [batching.make_micro_batch(samples, [rows[0]], width=width, pad_id=0, pad_to=pad_to,
                                              counts=False)]
        return [micro.to(self.device) for micro in made]

    def _no_tokens(self) -> torch.Tensor:
        return torch.zeros((), dtype=torch.int, device=self.device)

    # ---------------------------------------------------------------------------------------------
    # training
    # ---------------------------------------------------------------------------------------------

    def run_train_step(self, batch: RolloutBatch) -> dict[str, float]:
        started = time.perf_counter()
        samples = batch.samples
        if not samples:
            return {"train/samples": 0.0, "train/tokens": 0.0, "train/updates": 0.0,
                    "train/seconds": time.perf_counter() - started}
        check_samples(samples)
        loss_batch, trainer_old = self._loss_batch(samples)
        advantages, returns = self.loss.advantages(loss_batch)
        loss_batch.advantages, loss_batch.returns = advantages, returns

        per_update = [self._update(samples, loss_batch, chunk)
                      for chunk in _chunks(len(samples), self.global_batch_size or len(samples))]
        self.steps += 1

        columns: dict[str, list[float]] = defaultdict(list)
        for update in per_update:
            for name, value in update.items():
                columns[name].append(value)
        metrics = {f"train/{name}": sum(values) / len(values) for name, values in columns.items()}
        metrics["train/lr"] = per_update[-1]["lr"]
        metrics["train/skipped_updates"] = sum(update["skipped_updates"] for update in per_update)
        metrics.update(batch_metrics(samples, loss_batch.advantages.cpu(), loss_batch.response_mask.cpu(),
                                     trainer_old))
        metrics["train/updates"] = float(len(per_update))
        metrics["train/seconds"] = time.perf_counter() - started
        return metrics

    def _loss_batch(self, samples: list[Sample]) -> tuple[LossBatch, torch.Tensor | None]:
        """The step's :class:`LossBatch` (on this rank's device), and the trainer's old log-probs
        (CPU; ``None`` when the loss does not need them and the rollout's are used)."""
        width = max(s.response_length for s in samples)
        for position, sample in enumerate(samples):
            if sample.reward is None or not math.isfinite(sample.reward):
                raise ValueError(f"sample {position} (index {sample.index}, group {sample.group_index}) has reward "
                                 f"{sample.reward!r}: every sample must be scored with a finite reward before training")
        mask = batching.response_mask(samples, width)
        have_rollout = all(s.rollout_logprobs is not None for s in samples)
        rollout = batching.per_token([s.rollout_logprobs for s in samples], width) if have_rollout else None
        rows = range(len(samples))
        trainer_old = None
        if self.loss.needs_old_logprobs or rollout is None:
            trainer_old = self._forward_logprobs(self.model, samples, rows, width, self.temperature)
        ref = None
        if self.ref_model is not None:
            ref = self._forward_logprobs(self.ref_model, samples, rows, width, self.temperature)
        on = functools.partial(_to, device=self.device)
        batch = LossBatch(
            rewards=on(torch.tensor([s.reward for s in samples], dtype=torch.float32)),
            group_index=on(torch.tensor([s.group_index for s in samples], dtype=torch.long)),
            response_mask=on(mask),
            old_logprobs=on(trainer_old if trainer_old is not None else rollout),
            ref_logprobs=on(ref),
            rollout_logprobs=on(rollout),
            total_tokens=int(mask.sum()),
            total_samples=len(samples),
        )
        return batch, trainer_old

    def _update(self, samples: list[Sample], loss_batch: LossBatch, chunk: list[int]) -> dict[str, float]:
        """One optimizer update on the samples ``chunk``, normalised by the chunk's totals."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        index = torch.tensor(chunk, dtype=torch.long, device=self.device)
        step_batch = replace(loss_batch, total_tokens=int(loss_batch.response_mask[index].sum()),
                             total_samples=len(chunk))
        width = int(loss_batch.response_mask.shape[1])
        micro_batches = self._micro_batches(samples, chunk, width)
        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator: Iterator[batching.MicroBatch], chunk_model: Any) -> tuple[Any, Callable]:
            micro = next(data_iterator)
            output = chunk_model(micro.input_ids, micro.position_ids, None)
            return output, functools.partial(self._micro_loss, micro, step_batch)

        outputs = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[self.model],
            num_microbatches=len(micro_batches), seq_length=max(m.length for m in micro_batches),
            micro_batch_size=max(m.size for m in micro_batches), forward_only=False)
        totals = self._reduced_metrics(outputs)

        self.scheduler.step(1)
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm, skipped = self._optimizer_step()
        self.updates += 1
        return {**totals, "grad_norm": grad_norm, "lr": lr, "skipped_updates": float(skipped)}

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
        return value, self._no_tokens(), {"loss": float(value.detach()), **{k: float(v) for k, v in metrics.items()}}

    def _reduced_metrics(self, outputs: list[dict[str, float]]) -> dict[str, float]:
        """Micro-batch metrics summed over micro-batches and data-parallel ranks (they are
        normalised by the update's totals), from the last pipeline stage to every rank."""
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

    def _optimizer_step(self) -> tuple[float, bool]:
        """Clip and apply the accumulated gradients; ``(grad norm before clipping, skipped)``.

        Megatron's ``ChainedOptimizer.step`` in its parts, so that an update with a non-finite
        gradient norm is dropped instead of written into the weights."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        if self.optimizer.prepare_grads():          # fp16 loss scaling found an overflow
            self.optimizer.zero_grad()
            return math.nan, True
        grad_norm = float(self.optimizer.get_grad_norm())
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad()
            return grad_norm, True
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            parameters = optimizer.get_parameters()
            if parameters and optimizer.config.clip_grad > 0.0:
                clip_grad_by_total_norm_fp32(parameters, max_norm=optimizer.config.clip_grad, total_norm=grad_norm,
                                             use_decoupled_grad=_decoupled_grad(optimizer.config))
        self.optimizer.step_with_ready_grads()
        return grad_norm, False

    # ---------------------------------------------------------------------------------------------
    # checkpoints, offload
    # ---------------------------------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "distributed_optimizer": [optimizer.get_parameter_state_dp_reshardable()
                                      for optimizer in self._sharded_optimizers()],
            "scheduler": self.scheduler.state_dict(),
            "rng": checkpoint.rng_state(),
            "steps": self.steps,
            "updates": self.updates,
            "layout": self._layout(),
        }
        checkpoint.write(path, hf_tensors=export_hf_weights(self.model, self.converter, self.groups),
                         model_dir=self.model_dir, state=state)

    @torch.no_grad()
    def load_checkpoint(self, path: str) -> None:
        state = checkpoint.read_state(path)
        if state["layout"] != self._layout():
            raise ValueError(f"checkpoint {path} was written with the parallel layout {state['layout']}, this trainer "
                             f"runs {self._layout()}: resume with the same sizes (its model/ directory loads "
                             f"into any layout as --model)")
        read = hf_tensor_reader(Path(path) / checkpoint.MODEL_SUBDIR)
        load_hf_weights(self.model, self.converter, read, self.groups.tp_rank)
        self.optimizer.reload_model_params()
        self.optimizer.load_state_dict(state["optimizer"])
        for optimizer, shard in zip(self._sharded_optimizers(), state["distributed_optimizer"], strict=True):
            _unshare_steps(optimizer.optimizer)
            optimizer.load_parameter_state_from_dp_reshardable(_marked_unpadded(shard))
        self.scheduler.load_state_dict(state["scheduler"])
        checkpoint.set_rng_state(state["rng"])
        self.steps = state["steps"]
        self.updates = state["updates"]

    def _sharded_optimizers(self) -> list[Any]:
        """The distributed (state-sharding) optimizers among megatron's chained ones."""
        chained = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        return [optimizer for optimizer in chained if hasattr(optimizer, "get_parameter_state_dp_reshardable")]

    def _layout(self) -> dict[str, int]:
        return {"world": dist.get_world_size(), "tp": self.groups.tp_size, "pp": self.groups.pp_size,
                "dp": self.groups.dp_size}

    def _offload(self) -> None:
        if self.device.type != "cuda":
            return
        self.optimizer.offload_to_cpu()
        self.model.offload_grad_buffers()
        torch.cuda.empty_cache()

    def _onload(self) -> None:
        if self.device.type != "cuda":
            return
        self.model.restore_grad_buffers()
        self.optimizer.restore_from_cpu()


# -------------------------------------------------------------------------------------------------


def _finalize_model_grads(model: list[Any], num_tokens: Any = None, **kwargs: Any) -> None:
    """megatron's ``finalize_model_grads`` without its division by the number of tokens: our
    losses are already normalised by the update's totals."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model, None, **kwargs)


def _unshare_steps(inner: Any) -> None:
    """Give every parameter its own Adam ``step`` tensor. megatron 0.16's distributed optimizer,
    with torch's Adam (no TransformerEngine/apex), loads one ``step`` tensor into every parameter's
    state; torch then increments that shared tensor once per parameter and the bias correction
    goes wrong after a resume."""
    for state in inner.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"] = state["step"].clone()


def _marked_unpadded(shard: dict[Any, Any]) -> dict[Any, Any]:
    """A distributed optimizer's ``get_parameter_state_dp_reshardable()`` made loadable: megatron
    0.16's ``load_parameter_state_from_dp_reshardable`` skips entries whose ``padding`` flag is set
    but its saver writes no flag (it saves no padding entries)."""
    for key, per_dtype in shard.items():
        if isinstance(key, int):
            for buckets in per_dtype.values():
                for bucket in buckets:
                    for entry in bucket:
                        entry.setdefault("padding", False)
    return shard


def _explained(function: Callable[..., Any], *args: Any) -> Any:
    """Run ``function``; a failure from calling CUDA on a machine without it becomes a UsageError."""
    try:
        return function(*args)
    except (AssertionError, RuntimeError) as exc:
        text = str(exc)
        if not torch.cuda.is_available() and ("CUDA" in text or "NVIDIA driver" in text):
            raise UsageError(f"{NO_CUDA_HINT} ({type(exc).__name__}: {text})") from exc
        raise


def _decoupled_grad(optimizer_config: Any) -> bool:
    """Whether megatron keeps this optimizer's gradients in ``decoupled_grad`` (precision-aware optimizer)."""
    return bool(getattr(optimizer_config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8",
                        getattr(optimizer_config, "use_precision_aware_optimizer", False)))


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def _chunks(size: int, chunk_size: int) -> Iterator[list[int]]:
    for start in range(0, size, max(1, chunk_size)):
        yield list(range(start, min(size, start + chunk_size)))
