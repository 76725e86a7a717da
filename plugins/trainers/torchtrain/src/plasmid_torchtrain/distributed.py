"""Data-parallel training across the ranks of the default ``torch.distributed`` process group.

A runtime that starts several trainer processes (the Ray runtime's ``--trainer-workers``)
initialises the default group before it builds the trainer; without one, :class:`DataParallel`
is a single rank and every method is a no-op.

Every rank receives the whole batch and computes its advantages on all of it (cheap, and exact
for group-normalised and whitened advantages). The no-grad passes (old and reference log-probs,
critic values) are sharded and gathered back, so every rank holds the whole batch's tensors.
Forward and backward run only on the rank's shard of each optimizer update's samples; since the
loss of every micro-batch is normalised by the *global* totals (``LossBatch.total_tokens`` /
``total_samples``), the gradients are all-reduced with SUM, and so are the accumulated loss
metrics, so that every rank clips, steps and reports exactly what one process training the whole
batch would. The same sums make every rank refuse a bad step alike (a non-finite summed loss or
gradient norm); the weight check's answer is agreed with :meth:`DataParallel.any`.

With ``--torchtrain-sharding fsdp`` (the default with several ranks) the policy is sharded with
FSDP2 (:func:`shard_model`): the same batch split and global normalisation, but each rank keeps
only its shard of the parameters, gradients (reduce-scattered with SUM in the backward pass) and
AdamW state; every forward pass is a collective, so ranks run equally many (:meth:`DataParallel.
micro_batches` with ``equal``), and reads (log-probs, exports, saves) run on every rank (the
trainer is *collective*, :class:`plasmid.protocols.Trainer`). The reference model and the critic
stay replicated.

A LoRA policy (``--lora-rank``) is sharded the same way: each layer unit then holds frozen base
weights beside trainable adapters (FSDP2 gathers both and reduce-scatters gradients of the
adapters alone); the optimizer holds the adapters' shards. Its merged-weight export computes
``W + scale * B @ A`` on the shards (DTensor ops: the small ``A`` is gathered) and gathers each
merged tensor whole as its bucket is copied, as for full training.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch


def token_budget_runs(rows: Sequence[int], max_rows: int, lengths: Sequence[int] | None = None,
                      max_tokens: int | None = None) -> list[list[int]]:
    """``rows`` in order, cut into consecutive runs of at most ``max_rows`` rows and, with
    ``max_tokens``, whose ``lengths[row]`` sum to at most ``max_tokens``; a row longer than the
    budget is a run of its own."""
    runs: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for row in rows:
        length = lengths[row] if lengths is not None and max_tokens is not None else 0
        if current and (len(current) >= max(1, max_rows) or (max_tokens is not None and tokens + length > max_tokens)):
            runs.append(current)
            current, tokens = [], 0
        current.append(row)
        tokens += length
    if current:
        runs.append(current)
    return runs


class DataParallel:
    """This process's rank in the default process group (``rank 0 of 1`` without one)."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank, self.world = rank, world

    @classmethod
    def current(cls) -> DataParallel:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def shard(self, size: int) -> torch.Tensor:
        """This rank's contiguous share of ``range(size)`` (``[b]`` int64; shares differ by at most one)."""
        return torch.tensor_split(torch.arange(size), self.world)[self.rank]

    def micro_batches(self, size: int, micro_batch_size: int, *, equal: bool = False,
                      lengths: Sequence[int] | None = None, max_tokens: int | None = None) -> Iterator[torch.Tensor]:
        """This rank's shard of ``range(size)`` in consecutive micro-batches of at most
        ``micro_batch_size`` rows and, with ``max_tokens``, at most that many tokens (``lengths``:
        each row's; a longer row is a micro-batch of its own: :func:`token_budget_runs`).

        ``equal`` (an FSDP2 model, whose every forward pass is a collective): every rank yields
        as many micro-batches as the rank with the most, the missing ones empty (``[0]``); the
        caller runs a forward pass for each that contributes nothing."""
        shards = torch.tensor_split(torch.arange(size), self.world)

        def runs(rows: torch.Tensor) -> list[list[int]]:
            return token_budget_runs(rows.tolist(), micro_batch_size, lengths, max_tokens)

        mine = runs(shards[self.rank])
        count = max(len(runs(part)) for part in shards) if equal else len(mine)
        for index in range(count):
            yield torch.tensor(mine[index] if index < len(mine) else [], dtype=torch.long)

    def gather_rows(self, local: torch.Tensor, size: int) -> torch.Tensor:
        """The ``[size, ...]`` tensor whose shards (:meth:`shard`) each rank computed as ``local``."""
        if not self.enabled:
            return local
        import torch.distributed as dist

        longest = max(len(part) for part in torch.tensor_split(torch.arange(size), self.world))
        padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=local.device)
        padded[: len(local)] = local
        gathered = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(gathered, padded)
        counts = [len(part) for part in torch.tensor_split(torch.arange(size), self.world)]
        return torch.cat([part[:count] for part, count in zip(gathered, counts, strict=True)])

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """All-reduce (SUM) the gradients of ``parameters`` in one flat buffer; a rank without
        a gradient (an empty shard) contributes zeros."""
        if not self.enabled:
            return
        import torch.distributed as dist

        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset: offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def broadcast(self, tensors: Iterable[torch.Tensor]) -> None:
        """Give every rank rank 0's values of ``tensors`` (in place; each rank passes its own tensors
        of the same shapes in the same order). Used on LoRA adapters, which peft initialises from
        each process's random generator, before the model is sharded."""
        if not self.enabled:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for tensor in tensors:
                dist.broadcast(tensor, src=0)

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (an all-reduce MAX): a decision every rank takes the same."""
        if not self.enabled:
            return flag
        import torch.distributed as dist

        value = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        """``totals`` summed over ranks, key by key (a key missing on a rank counts 0)."""
        if not self.enabled:
            return dict(totals)
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, dict(totals))
        summed: dict[str, float] = {}
        for rank_totals in everyone:
            for name, value in rank_totals.items():
                summed[name] = summed.get(name, 0.0) + float(value)
        return summed


# -------------------------------------------------------------------------------------------------
# FSDP2: parameters, gradients and optimizer state sharded over the ranks
# -------------------------------------------------------------------------------------------------

def shard_model(model: torch.nn.Module, world: int, device_type: str) -> int:
    """Shard ``model`` over the ``world`` ranks of the default group with FSDP2
    (``torch.distributed.fsdp.fully_shard``): each transformer layer is a unit of its own (its
    parameters gathered for its forward and backward only), the rest (embeddings, final norm, a
    tied or untied LM head) one root unit. Gradients are reduce-scattered with SUM (divide factor
    1): every rank's micro-batch losses are normalised by the update's global totals, as in the
    replicated path. The backend is the group's (gloo on CPU, NCCL on GPU). Returns the number of
    layer units."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from transformers.modeling_layers import GradientCheckpointingLayer

    mesh = init_device_mesh(device_type, (world,))
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)      # a plain SUM (gloo has no PREMUL_SUM)
    return len(layers)


def reshard(model: torch.nn.Module) -> None:
    """Free the whole parameters an FSDP2 model keeps after a forward pass (its root keeps them for
    the backward that usually follows), so that ``model.parameters()`` and ``state_dict()`` are its
    sharded DTensors again."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) parameter, sharing its storage; a plain tensor as is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a sharded (DTensor) one, gathered from every rank (a collective call);
    a plain tensor as is."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


class ShardedSync:
    """The :class:`plasmid_torch.optimizer_update.GradientSync` of an FSDP2 model: the backward
    passes already reduce-scattered (summed) its gradients, so only the metrics are summed."""

    def __init__(self, dp: DataParallel) -> None:
        self.dp = dp

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        return None

    def sum_metrics(self, totals: dict[str, float]) -> dict[str, float]:
        return self.dp.sum_metrics(totals)
