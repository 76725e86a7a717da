"""Forward-only passes of a megatron model over micro-batches, read into one tensor on every rank.

The policy's log-probs and the critic's values are both "run the model over this rank's
micro-batches without gradient, read a ``[b, T]`` tensor from each micro-batch's output on the last
pipeline stage, and give every rank the whole ``[rows, T]`` table": :func:`forward_rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from plasmid_megatron import batching
from plasmid_megatron.parallel import Groups, all_reduce_sum


def no_tokens(device: torch.device) -> torch.Tensor:
    """The token count a loss function returns to megatron's schedule: 0, because this trainer's
    losses are already normalised by the update's totals (see ``_finalize_model_grads``)."""
    return torch.zeros((), dtype=torch.int, device=device)


def forward_rows(model: Any, micro_batches: Sequence[batching.MicroBatch], count: int, width: int,
                 read: Callable[[torch.Tensor, batching.MicroBatch], torch.Tensor], groups: Groups,
                 device: torch.device,
                 around: Callable[[batching.MicroBatch], AbstractContextManager[Any]] | None = None) -> torch.Tensor:
    """``[count, width]`` float32 CPU table, the same on every rank (a collective over the pipeline
    and data-parallel groups).

    :param model: the (DDP-wrapped) model stage of this rank; put in eval mode.
    :param micro_batches: this rank's share of the rows (stand-ins, ``counts=False``, are run to keep
        collectives in step, and not read).
    :param read: ``read(output, micro) -> [b, width]`` from the last stage's output of one micro-batch
        (logits ``[b, s, V_local]`` or values ``[b, s, 1]``); zeros beyond each response.
    :param around: ``around(micro)``, a context each micro-batch's forward runs in (MoE routing
        replay records there: :mod:`plasmid_megatron.routing_replay`).
    Rows no data-parallel rank holds stay zero.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    model.eval()

    def forward_step(data_iterator: Iterator[batching.MicroBatch], chunk: Any) -> tuple[Any, Callable]:
        micro = next(data_iterator)
        with around(micro) if around is not None else nullcontext():
            output = chunk(micro.input_ids, micro.position_ids, None)

        def collect(output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            return (output.new_zeros(()), no_tokens(device),
                    {"rows": micro.rows, "values": read(output, micro).float().cpu(), "counts": micro.counts})

        return output, collect

    with torch.no_grad():
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[model],
            num_microbatches=len(micro_batches), seq_length=max(m.length for m in micro_batches),
            micro_batch_size=max(m.size for m in micro_batches), forward_only=True)
    table = torch.zeros((count, width), dtype=torch.float32)
    if groups.last_stage:
        for output in outputs:
            if output["counts"]:
                table[output["rows"]] = output["values"]
    table = table.to(device)
    all_reduce_sum(table, groups.pp_group, groups.pp_size)   # other stages hold zeros
    all_reduce_sum(table, groups.dp_group, groups.dp_size)   # disjoint rows per rank
    return table.cpu()
