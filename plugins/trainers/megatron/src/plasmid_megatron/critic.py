"""The critic of the megatron trainer, built when the loss ``needs_critic`` (PPO): a value model.

:class:`MegatronCritic` is ``--model``'s body as a megatron ``GPTModel`` (the policy's
``TransformerConfig``, layer spec and parallel layout, weights loaded with the policy's converter)
whose output layer is a value head (:func:`value_head_class`): ``Linear(hidden_size, 1)``
computed in float32, weight and bias zero at the start (every value is 0 before training), as the torch
trainer's critic. It is wrapped
in its own megatron ``DistributedDataParallel``, with its own ``get_megatron_optimizer`` (the
policy's settings at ``--critic-lr``) and ``OptimizerParamScheduler``; it is never exported to
the engines.

Tensor parallelism: the body's final-norm output is the same on every tensor-parallel rank (gathered
from the sequence-parallel split when ``sequence_parallel`` is on), so every rank computes the same
values and the same loss. The head's parameters are therefore ordinary replicated parameters: their
gradient is complete on each rank (no reduction over the tensor-parallel group), and megatron counts
them once in the gradient norm (``param_is_not_tensor_parallel_duplicate``: on tensor-parallel rank
0 only). Pipeline parallelism: the head lives on the last stage; values are read there and summed
into every rank (other stages contribute zeros), as the policy's log-probs are.

The value of response token ``t`` is read at position ``prompt_length - 1 + t``, the position
whose output predicts that token (:attr:`plasmid_megatron.batching.MicroBatch.predicting`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from plasmid.types import LossBatch
from plasmid_megatron import batching, passes
from plasmid_megatron.context_parallel import sum_over_context_parallel
from plasmid_megatron.converter import Converter
from plasmid_megatron.model import build_gpt_model, in_training_precision, load_hf_weights, unwrapped
from plasmid_megatron.model_spec import ModelSpec
from plasmid_megatron.parallel import Groups
from plasmid_torch.trainer_options import TrainerOptions

#: the micro-batch's value loss among its reported metrics (summed like them, so that the update can
#: refuse a non-finite one), taken out before the update's metrics are returned
LOSS_KEY = "\0value_loss"


@functools.cache
def value_head_class() -> type:
    """The value head's class, a megatron ``MegatronModule`` (so that ``GPTModel.sharded_state_dict``
    saves its parameters, as replicated tensors); made on first use, when megatron is imported."""
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
    from megatron.core.transformer.module import MegatronModule

    class ValueHead(MegatronModule):
        """Stands in for ``GPTModel.output_layer``: ``[s, b, hidden]`` -> ``([s, b, 1] float32 values, None)``.

        Called by ``GPTModel`` as ``output_layer(hidden, weight=None, runtime_gather_output=...)``.
        Parameters ``weight [1, hidden]`` and ``bias [1]`` start at zero, in float32 (in bf16/fp16
        with ``--megatron-bf16``/``fp16``, as the whole model); values are computed in float32. With
        ``sequence_parallel`` the input is this rank's slice of the sequence: it is gathered first,
        and the backward pass keeps this rank's slice of the gradient (identical on every rank).
        """

        def __init__(self, config: Any, device: torch.device) -> None:
            super().__init__(config)
            self.weight = torch.nn.Parameter(torch.zeros(1, config.hidden_size, dtype=torch.float32, device=device))
            self.bias = torch.nn.Parameter(torch.zeros(1, dtype=torch.float32, device=device))

        def forward(self, hidden_states: torch.Tensor, weight: Any = None,
                    runtime_gather_output: Any = None) -> tuple[torch.Tensor, None]:
            if self.config.sequence_parallel:
                hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
            return torch.nn.functional.linear(hidden_states.float(), self.weight.float(), self.bias.float()), None

    return ValueHead


def response_values(output: torch.Tensor, micro: batching.MicroBatch, groups: Groups) -> torch.Tensor:
    """``[b, T]`` float32 values of the micro-batch's response tokens from this rank's ``[b, s, 1]``
    output: response token ``t`` at position ``predicting[:, t]``, zero beyond each response. With
    context parallelism each rank reads the positions it holds and the values are summed over the
    context-parallel group, as the log-probs are (:mod:`plasmid_megatron.context_parallel`)."""
    values = output[..., 0].float().gather(1, micro.predicting)
    here = micro.in_response & micro.held
    values = torch.where(here, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return sum_over_context_parallel(values, groups.cp_group, groups.cp_size)


class MegatronCritic:
    """The critic's model, optimizer and LR scheduler, and its two passes (values, one update).

    :ivar model: megatron ``DistributedDataParallel`` around this rank's ``GPTModel`` stage; on the
        last stage ``output_layer`` is the value head.
    :ivar optimizer: from ``get_megatron_optimizer(optimizer_config, [model])``.
    :ivar scheduler: ``make_scheduler(optimizer)`` (an ``OptimizerParamScheduler``).

    Built on the trainer's worker thread, after the policy (its ``config`` must already carry the
    trainer's ``finalize_model_grads_func``). Every method is collective over the trainer's ranks.
    """

    def __init__(self, *, spec: ModelSpec, config: Any, converter: Converter, read: Callable[[str], torch.Tensor],
                 padded_vocab_size: int, groups: Groups, device: torch.device, ddp_config: Any,
                 optimizer_config: Any, make_scheduler: Callable[[Any], Any]) -> None:
        from megatron.core.distributed import DistributedDataParallel
        from megatron.core.optimizer import get_megatron_optimizer

        self.groups = groups
        self.device = device
        #: its own copy of the policy's TransformerConfig: megatron's schedules read no_sync_func from it
        self.config = copy.copy(config)
        # built untied: an output layer of its own (loaded, then replaced), never the embedding
        body = build_gpt_model(dataclasses.replace(spec, tie_word_embeddings=False), self.config, padded_vocab_size)
        load_hf_weights(body, converter, read, groups.tp_rank)
        if body.post_process:
            body.output_layer = value_head_class()(self.config, next(body.parameters()).device)
        self.model = DistributedDataParallel(self.config, ddp_config, in_training_precision(body, self.config))
        self.config.no_sync_func = self.model.no_sync
        self.optimizer = get_megatron_optimizer(optimizer_config, [self.model])
        self.scheduler = make_scheduler(self.optimizer)

    @property
    def value_head(self) -> torch.nn.Module | None:
        """The value head (``None`` on a pipeline stage other than the last)."""
        model = unwrapped(self.model)
        return model.output_layer if model.post_process else None

    # ---------------------------------------------------------------------------------------------

    def values(self, micro_batches: list[batching.MicroBatch], count: int, width: int) -> torch.Tensor:
        """``[count, width]`` float32 CPU values of the rows in ``micro_batches`` (this rank's
        share; zeros elsewhere and beyond each response), without gradient, on every rank
        (:func:`plasmid_megatron.passes.forward_rows`)."""
        return passes.forward_rows(self.model, micro_batches, count, width,
                                   lambda output, micro: response_values(output, micro, self.groups), self.groups,
                                   self.device)

    def update(self, micro_batches: list[batching.MicroBatch], step_batch: LossBatch, loss: Any, *,
               reduce_metrics: Callable[[list[dict[str, float]]], dict[str, float]],
               optimizer_step: Callable[[float, Any, Any], dict[str, float]]) -> dict[str, float]:
        """One critic optimizer update on ``loss.value_loss`` over this rank's ``micro_batches`` of
        ``step_batch`` (which carries ``values`` and ``returns``; normalised by its totals).

        ``reduce_metrics`` sums the micro-batch metrics over micro-batches and ranks,
        ``optimizer_step(loss, optimizer, scheduler)`` steps the schedule, clips and applies the
        gradients, or refuses a non-finite update (its metrics); both are the trainer's, shared
        with the policy's update. Returns the loss's metrics and ``critic_grad_norm``,
        ``critic_lr``, ``critic_skipped_updates``, or on a refusal ``bad_step/critic_<reason>``."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

        def forward_step(data_iterator: Iterator[batching.MicroBatch], chunk: Any) -> tuple[Any, Callable]:
            micro = next(data_iterator)
            output = chunk(micro.input_ids, micro.position_ids, None)
            return output, functools.partial(self._micro_loss, micro, step_batch, loss)

        outputs = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[self.model],
            num_microbatches=len(micro_batches), seq_length=max(m.length for m in micro_batches),
            micro_batch_size=max(m.size for m in micro_batches), forward_only=False)
        totals = reduce_metrics(outputs)
        loss_total = totals.pop(LOSS_KEY, 0.0)
        return {**totals, **optimizer_step(loss_total, self.optimizer, self.scheduler)}

    def _micro_loss(self, micro: batching.MicroBatch, step_batch: LossBatch, loss: Any,
                    output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """``loss.value_loss`` of one micro-batch (megatron's ``loss_func``, last stage only)."""
        values = response_values(output, micro, self.groups)
        rows = step_batch.select(micro.rows.to(values.device))
        if not micro.counts:
            rows = dataclasses.replace(rows, response_mask=torch.zeros_like(rows.response_mask))
        value, metrics = loss.value_loss(rows, values)
        if not micro.counts:
            value = value * 0.0
            metrics = dict.fromkeys(metrics, 0.0)
        reported = {LOSS_KEY: float(value.detach()), **{name: float(metric) for name, metric in metrics.items()}}
        return value, passes.no_tokens(self.device), reported


def critic_lr_settings(options: TrainerOptions) -> tuple[float, float]:
    """``(lr, min_lr)`` of the critic: ``--critic-lr`` (default ``--lr``), and ``--min-lr`` scaled by
    ``critic_lr / lr`` so that the critic's schedule has the policy's shape."""
    lr = options.critic_learning_rate
    return lr, options.min_lr * (lr / options.lr)
