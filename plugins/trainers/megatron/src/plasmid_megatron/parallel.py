"""The process groups: ``torch.distributed`` and megatron-core's model-parallel state.

A trainer process is one rank. Launched alone (no ``WORLD_SIZE`` in the environment) it is a world
of one, initialised over a free local TCP port; launched by ``torchrun`` (or anything that sets
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) it joins that world, and every rank runs
the same trainer calls in the same order (SPMD). The backend is NCCL with CUDA, gloo without.

megatron-core's parallel state is process-global. A second trainer in the same process (tests,
a reference model) reuses it when the sizes are the same and rebuilds it otherwise.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelSizes:
    """``tp * pp * cp * dp == world size``; ``ep`` splits experts within ``dp * cp``.

    Expert layers are laid out separately (megatron's expert groups): ``etp * ep * pp`` must divide
    the world size, ``etp`` being the expert-tensor-parallel size (``None``: ``tp``, megatron's default).
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    def data_parallel_size(self, world_size: int) -> int:
        model_parallel = self.tp * self.pp * self.cp
        if world_size % model_parallel:
            raise ValueError(f"the world size {world_size} is not a multiple of tensor x pipeline x context "
                             f"parallel sizes {self.tp} x {self.pp} x {self.cp}")
        experts = self.expert_tp * self.ep * self.pp
        if world_size % experts:
            raise ValueError(f"the world size {world_size} is not a multiple of expert-tensor x expert x pipeline "
                             f"parallel sizes {self.expert_tp} x {self.ep} x {self.pp}")
        return world_size // model_parallel


def device() -> torch.device:
    """This rank's device: its CUDA device (``LOCAL_RANK``) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed() -> None:
    """Join the process group described by the environment, or make a world of one."""
    if dist.is_initialized():
        return
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "nccl" if cuda else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend=backend, init_method="env://")
    else:
        dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                                world_size=1)


def init_model_parallel(sizes: ParallelSizes, seed: int) -> None:
    """Initialise (or reuse, when the sizes match) megatron's model-parallel groups and seed its
    RNG tracker with ``seed``."""
    from megatron.core import parallel_state, tensor_parallel

    init_distributed()
    sizes.data_parallel_size(dist.get_world_size())
    if parallel_state.model_parallel_is_initialized():
        current = ParallelSizes(parallel_state.get_tensor_model_parallel_world_size(),
                                parallel_state.get_pipeline_model_parallel_world_size(),
                                parallel_state.get_context_parallel_world_size(),
                                parallel_state.get_expert_model_parallel_world_size(),
                                parallel_state.get_expert_tensor_parallel_world_size())
        if replace(current, etp=current.expert_tp) != replace(sizes, etp=sizes.expert_tp):
            parallel_state.destroy_model_parallel()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=sizes.tp,
                                                 pipeline_model_parallel_size=sizes.pp,
                                                 context_parallel_size=sizes.cp,
                                                 expert_model_parallel_size=sizes.ep,
                                                 expert_tensor_parallel_size=sizes.expert_tp)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -------------------------------------------------------------------------------------------------
# the groups a trainer uses, by role
# -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Groups:
    """This rank's place in the parallel layout (megatron's groups, read once).

    ``dp_*`` is the pure data-parallel group (without context parallelism): the ``cp`` ranks of a
    context-parallel group share one data-parallel rank and process the same samples, each holding
    its chunks of every sequence (:mod:`plasmid_megatron.context_parallel`).
    """

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int
    cp_rank: int
    cp_size: int
    tp_group: object
    pp_group: object
    dp_group: object
    cp_group: object
    pp_last_rank: int
    #: expert parallelism (mixture-of-experts layers): this rank's expert-parallel rank, size and
    #: group, and the expert-tensor-parallel ones that split each expert's weights
    ep_rank: int = 0
    ep_size: int = 1
    ep_group: object = None
    etp_rank: int = 0
    etp_size: int = 1
    etp_group: object = None

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1


def current_groups() -> Groups:
    from megatron.core import parallel_state as ps

    return Groups(
        tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(), pp_size=ps.get_pipeline_model_parallel_world_size(),
        dp_rank=ps.get_data_parallel_rank(), dp_size=ps.get_data_parallel_world_size(),
        cp_rank=ps.get_context_parallel_rank(), cp_size=ps.get_context_parallel_world_size(),
        tp_group=ps.get_tensor_model_parallel_group(), pp_group=ps.get_pipeline_model_parallel_group(),
        dp_group=ps.get_data_parallel_group(), cp_group=ps.get_context_parallel_group(),
        pp_last_rank=ps.get_pipeline_model_parallel_last_rank(),
        ep_rank=ps.get_expert_model_parallel_rank(), ep_size=ps.get_expert_model_parallel_world_size(),
        ep_group=ps.get_expert_model_parallel_group(), etp_rank=ps.get_expert_tensor_parallel_rank(),
        etp_size=ps.get_expert_tensor_parallel_world_size(), etp_group=ps.get_expert_tensor_parallel_group(),
    )


def all_reduce_sum(tensor: torch.Tensor, group: object, size: int) -> torch.Tensor:
    """Sum ``tensor`` in place over ``group`` (a no-op for a group of one)."""
    if size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def all_gather(tensor: torch.Tensor, group: object, size: int) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on all ranks), in group-rank order."""
    if size == 1:
        return [tensor]
    pieces = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(pieces, tensor.contiguous(), group=group)
    return pieces


def broadcast_object(value: object, src: int, group: object, size: int) -> object:
    """``value`` of global rank ``src``, on every rank of ``group``."""
    if size == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=src, group=group)
    return holder[0]
