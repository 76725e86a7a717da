"""The trainer's resumable state as a megatron-core sharded state dict, and putting a loaded one back.

The trainer's checkpoint (:mod:`plasmid_megatron.checkpoint`) saves it with
``megatron.core.dist_checkpointing``: every rank hands in its own shards, described in global
coordinates (the whole tensor's shape and this rank's slice of it), so a checkpoint written in one
parallel layout loads into another: tensor, pipeline, data and expert parallel sizes may all change.
What may not change is checked (:func:`check_saved`): the trainables, and each one's kind of
optimizer (Adam or SGD, distributed or not, its precision), since each keeps different state.

What is in it, for each :class:`Trainable` (the policy, named ``policy``; the critic of a PPO loss,
named ``critic``):

- sharded: the model's weights, keys ``<name>.<megatron key>`` (``GPTModel.sharded_state_dict()``
  of the unwrapped model, in megatron's TransformerEngine-compatible names whichever layer spec is
  used, e.g. ``policy.decoder.layers.0.self_attention.linear_qkv.weight``, layers stacked in one
  tensor); the optimizer's per-parameter state in the same global shapes, keys
  ``optimizer.state.<state>.<name>.<megatron key>``, ``<state>`` being ``exp_avg`` and
  ``exp_avg_sq`` (Adam), ``param`` (the distributed optimizer's float32 main weights, in its
  model-space format :data:`DISTRIBUTED_OPTIMIZER_FORMAT`) or ``fp32_param`` (the bf16/fp16
  optimizer's main weights);
- common (written once, by global rank 0, and read by every rank): the ``OptimizerParamScheduler``'s
  state; Adam's step count (``adam_step``) and the fp16 loss scaler's state (``grad_scaler``), what
  :func:`restore` takes from the checkpoint besides tensors; and megatron's own common optimizer
  state (param-group settings, laid out per chained optimizer), kept for inspection only.

And under ``trainer``: what the trainer passes in (its counters, layout and :func:`describe`).

The vocabulary padding depends on the tensor-parallel size; megatron marks the embedding and output
layer as ``allow_shape_mismatch``, so rows beyond the smaller padding are dropped or zero-filled
(padding rows are zero and get no gradient: nothing is lost).

Called on the trainer's worker thread by ``save_checkpoint``/``load_checkpoint``, on every rank (the
distributed optimizer gathers its state over the data-parallel group when saving).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from plasmid_megatron.model import unwrapped

#: how megatron's distributed optimizer lays out its state in the checkpoint: per model parameter
#: and state one tensor of the parameter's own global shape (as a non-distributed optimizer saves
#: it), independent of the data-parallel size and of the bucket layout, so it reshards in every
#: dimension. (0.16's other model-space format, ``fully_sharded_model_space``, needs flattened
#: sharded tensors, which its checkpointing no longer accepts.) Its cost: saving gathers each
#: tensor/pipeline-parallel shard's optimizer state over the data-parallel ranks, and loading reads
#: it whole on every rank, so both hold 12 bytes (fp32 weight and two Adam moments) per parameter of
#: that shard in host memory for a while.
DISTRIBUTED_OPTIMIZER_FORMAT = "fully_reshardable"
#: metadata for the optimizers' ``sharded_state_dict``: the format above, and no ``chained_<i>.``
#: key prefix (keys are per parameter already, so they stay the same however megatron chains its optimizers).
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": DISTRIBUTED_OPTIMIZER_FORMAT, "chained_optim_avoid_prefix": True}


class _FromCheckpoint:
    def __repr__(self) -> str:
        return "FROM_CHECKPOINT"


#: marks, in :func:`runtime_values`, a value that comes from the checkpoint
FROM_CHECKPOINT = _FromCheckpoint()


@dataclass(frozen=True)
class Trainable:
    """A trained model and what trains it.

    :ivar name: its key prefix in the checkpoint (``policy``, ``critic``).
    :ivar model: megatron ``DistributedDataParallel`` around this rank's ``GPTModel`` stage.
    :ivar optimizer: megatron optimizer from ``get_megatron_optimizer`` over ``[model]``.
    :ivar scheduler: its ``OptimizerParamScheduler``.
    """

    name: str
    model: Any
    optimizer: Any
    scheduler: Any


def sharded_state_dict(trainables: list[Trainable], trainer: dict[str, Any], *, loading: bool) -> dict[str, Any]:
    """This rank's sharded state dict of ``trainables`` plus ``trainer`` (common state: plain
    Python values, the same on every rank). ``loading``: the dict to load into (the optimizers
    then allocate the state tensors the checkpoint is read into)."""
    from megatron.core.dist_checkpointing.utils import add_prefix_for_sharding

    state: dict[str, Any] = {"trainer": trainer}
    for part in trainables:
        model_state = unwrapped(part.model).sharded_state_dict()
        add_prefix_for_sharding(model_state, f"{part.name}.")
        materialize_optimizer_state(part.optimizer)
        optimizer_state = part.optimizer.sharded_state_dict(model_state, is_loading=loading,
                                                            metadata=dict(OPTIMIZER_METADATA))
        state[part.name] = {"model": model_state, "optimizer": optimizer_state}
        if not loading:
            state[part.name].update(scheduler=part.scheduler.state_dict(), adam_step=adam_step(part.optimizer),
                                    grad_scaler=grad_scaler_state(part.optimizer))
    return state


def runtime_values(state: Any) -> Any:
    """``state`` (a :func:`sharded_state_dict` for loading) with every value the checkpoint fills
    in (sharded tensors, megatron's non-persistent objects) replaced by :data:`FROM_CHECKPOINT`:
    the runtime side for :func:`restore`. Take it before loading (megatron changes the dict)."""
    from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject, ShardedBase

    if isinstance(state, dict):
        return {key: runtime_values(value) for key, value in state.items()}
    if isinstance(state, list):
        return [runtime_values(value) for value in state]
    if isinstance(state, ShardedBase | LocalNonpersistentObject):
        return FROM_CHECKPOINT
    return copy.deepcopy(state)


def describe(trainables: list[Trainable]) -> dict[str, dict[str, Any]]:
    """What a checkpoint must match to load into ``trainables``: their names and, per trainable,
    the optimizer's kind (the state it keeps differs between them). Saved under ``trainer.parts``."""
    return {part.name: optimizer_kind(part.optimizer) for part in trainables}


def optimizer_kind(optimizer: Any) -> dict[str, Any]:
    """``{"optimizer": "adam"|"sgd", "distributed": bool, "precision": "bf16"|"fp16"|"fp32"}`` of a
    megatron optimizer (from its ``OptimizerConfig``)."""
    config = optimizer.config
    precision = "bf16" if config.bf16 else "fp16" if config.fp16 else "fp32"
    return {"optimizer": config.optimizer, "distributed": bool(config.use_distributed_optimizer),
            "precision": precision}


def check_saved(common: dict[str, Any], trainables: list[Trainable], path: Any) -> None:
    """Refuse, saying what to do, a checkpoint (its common state ``common``) that this trainer
    cannot resume: other trainables (a PPO run's critic, say) or another kind of optimizer (Adam
    or SGD, distributed or not, bf16/fp16/fp32: each keeps different state). Parallel sizes may differ."""
    saved = common.get("trainer", {}).get("parts")
    wanted = describe(trainables)
    if saved == wanted:
        return
    hint = (f"resume with the options it was written with (--loss, --megatron-optimizer, "
            f"--megatron-use-distributed-optimizer, --megatron-bf16/--megatron-fp16), or start a new run from its "
            f"weights with --model {path}/model")
    if not isinstance(saved, dict) or sorted(saved) != sorted(wanted):
        raise ValueError(f"checkpoint {path} holds {sorted(saved or [])} but this trainer trains {sorted(wanted)} "
                         f"(was it written with another --loss?): {hint}")
    raise ValueError(f"checkpoint {path} was written with the optimizers {saved}, this trainer has {wanted}: {hint}")


@torch.no_grad()
def restore(trainables: list[Trainable], runtime: Any, loaded: dict[str, Any]) -> dict[str, Any]:
    """Put what ``dist_checkpointing.load`` returned (``loaded``) for a :func:`sharded_state_dict`
    with ``loading=True`` into ``trainables``; ``runtime``: :func:`runtime_values` of that dict.
    Returns what was saved under ``trainer``.

    The optimizers get their tensors from the checkpoint, but their other state in the form they
    have now (their param groups' settings, which the LR scheduler sets before every update), with
    the checkpoint's Adam step count and fp16 loss scale: how megatron splits the parameters over
    chained optimizers may differ from the checkpoint's (expert parameters get an optimizer of their
    own only with expert parallelism), and megatron lays its common state out per chained optimizer."""
    for part in trainables:
        saved = loaded[part.name]
        unwrapped(part.model).load_state_dict(saved["model"], strict=True)
        optimizer_state = _filled(runtime[part.name]["optimizer"], saved["optimizer"])
        if saved["adam_step"] is not None:
            _set_adam_step(optimizer_state, saved["adam_step"])
        if saved["grad_scaler"] is not None:
            _set_grad_scaler(optimizer_state, saved["grad_scaler"])
        deferred = _take_param_states(part.optimizer, optimizer_state)
        part.optimizer.load_state_dict(optimizer_state)
        for distributed, param_state in deferred:
            _load_param_state(distributed, param_state)
        unshare_steps(part.optimizer)
        part.scheduler.load_state_dict(saved["scheduler"])
    return loaded["trainer"]


def _filled(runtime: Any, loaded: Any) -> Any:
    """``runtime`` with each :data:`FROM_CHECKPOINT` taken from ``loaded`` at the same place."""
    if runtime is FROM_CHECKPOINT:
        return loaded
    if isinstance(runtime, dict):
        return {key: _filled(value, loaded[key] if _holds(value) else None) for key, value in runtime.items()}
    if isinstance(runtime, list):
        return [_filled(value, loaded[index] if _holds(value) else None) for index, value in enumerate(runtime)]
    return runtime


def _holds(runtime: Any) -> bool:
    """Whether ``runtime`` has a :data:`FROM_CHECKPOINT` anywhere in it."""
    if runtime is FROM_CHECKPOINT:
        return True
    if isinstance(runtime, dict):
        return any(_holds(value) for value in runtime.values())
    if isinstance(runtime, list):
        return any(_holds(value) for value in runtime)
    return False


def adam_step(optimizer: Any) -> int | None:
    """The number of steps Adam has counted (the same for every parameter), or ``None`` for an
    optimizer without one (SGD). Read from torch's per-parameter state, or from the param groups
    (TransformerEngine's and Apex's Adam keep it there)."""
    for inner in _inner_optimizers(optimizer):
        for state in inner.state.values():
            if "step" in state:
                return int(state["step"])
        for group in inner.param_groups:
            if group.get("step") is not None:
                return int(group["step"])
    return None


def grad_scaler_state(optimizer: Any) -> dict[str, Any] | None:
    """The fp16 loss scaler's state (the first chained optimizer's; they move together), or ``None``."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        scaler = getattr(part, "grad_scaler", None)
        if scaler is not None:
            return scaler.state_dict()
    return None


def _set_adam_step(state: Any, step: int) -> None:
    """Write ``step`` wherever megatron's optimizer state dicts (``state``, nested as megatron nests
    them) keep Adam's step: a ``step`` in the param groups (distributed optimizer, TransformerEngine's
    Adam) or ``common_step`` beside torch's per-parameter state (non-distributed optimizers)."""
    if isinstance(state, list):
        for value in state:
            _set_adam_step(value, step)
        return
    if not isinstance(state, dict):
        return
    groups = state.get("param_groups")
    if isinstance(groups, list):
        for group in groups:
            if isinstance(group, dict) and "step" in group:
                group["step"] = step if group["step"] is None else type(group["step"])(step)
        per_param = state.get("state")
        if isinstance(per_param, dict) and any(isinstance(entry, dict) and "exp_avg" in entry
                                               for entry in per_param.values()):
            per_param["common_step"] = torch.tensor(float(step), dtype=torch.float32)
    for value in state.values():
        _set_adam_step(value, step)


def _set_grad_scaler(state: Any, scaler: dict[str, Any]) -> None:
    """Put the saved loss-scaler state wherever megatron's optimizer state dicts have one."""
    if isinstance(state, list):
        for value in state:
            _set_grad_scaler(value, scaler)
    elif isinstance(state, dict):
        if "grad_scaler" in state:
            state["grad_scaler"] = copy.deepcopy(scaler)
        for key, value in state.items():
            if key != "grad_scaler":
                _set_grad_scaler(value, scaler)


# -------------------------------------------------------------------------------------------------
# torch optimizer state: created lazily by torch, needed eagerly by megatron's checkpointing
# -------------------------------------------------------------------------------------------------


def _inner_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers inside megatron's (chained) optimizer."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [part.optimizer for part in chained if getattr(part, "optimizer", None) is not None]


def _keeps_step_per_parameter(inner: Any) -> bool:
    return isinstance(inner, torch.optim.Adam | torch.optim.AdamW)


def _zero_step(group: dict[str, Any], param: torch.Tensor) -> torch.Tensor:
    """The ``step`` torch's Adam gives a parameter's new state (float32; on the parameter's
    device when ``capturable`` or ``fused``, else on the CPU)."""
    if group.get("capturable") or group.get("fused"):
        return torch.zeros((), dtype=torch.float32, device=param.device)
    return torch.tensor(0.0, dtype=torch.float32)


def materialize_optimizer_state(optimizer: Any) -> None:
    """Create the state of every parameter that has none yet (before the first update, or after
    only skipped ones) as the optimizer would at its first step: megatron's ``init_state_fn``
    (Adam's moments at zero) and, for torch's Adam, ``step`` 0. Megatron's checkpointing needs the
    state to exist (its distributed optimizer's ``state_dict`` asserts one common step), and a
    checkpoint of such a state loads as an optimizer that has made no update."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    for part in chained:
        inner = getattr(part, "optimizer", None)
        init_state = getattr(part, "init_state_fn", None)
        if inner is None or init_state is None:
            continue
        if all(len(inner.state[param]) for group in inner.param_groups for param in group["params"]):
            continue
        init_state(inner, part.config)
        _complete_steps(inner)


def _take_param_states(optimizer: Any, state: dict[Any, Any]) -> list[tuple[Any, Any]]:
    """Remove the model-space parameter state of each distributed optimizer from the loaded
    ``state`` (so that megatron's ``load_state_dict`` loads everything else); returns
    ``[(distributed optimizer, its parameter state)]`` for :func:`_load_param_state`."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    # megatron's ChainedOptimizer: one optimizer's state dict as is, several keyed by their index
    per_optimizer = [(chained[0], state)] if len(chained) == 1 else [(part, state[i]) for i, part in enumerate(chained)]
    taken = []
    for part, part_state in per_optimizer:
        if isinstance(part_state, dict) and part_state.get("param_state_sharding_type") == DISTRIBUTED_OPTIMIZER_FORMAT:
            taken.append((part, part_state.pop("param_state")))
            part_state.pop("param_state_sharding_type")
    return taken


def _load_param_state(distributed: Any, param_state: Any) -> None:
    """megatron's ``load_parameter_state_from_fully_reshardable``, with torch Adam's ``step`` out of
    the way: megatron 0.16 copies every key of a parameter's state from the checkpoint, ``step``
    included, but the checkpoint keeps the step in the param groups (a ``KeyError: 'step'`` without
    TransformerEngine's or Apex's Adam, which keep none per parameter). The steps are put back as
    ``load_state_dict`` set them."""
    inner = distributed.optimizer
    steps = {param: state.pop("step") for param, state in inner.state.items() if "step" in state}
    try:
        distributed.load_parameter_state_from_fully_reshardable(param_state)
    finally:
        for param, step in steps.items():
            inner.state[param]["step"] = step


def unshare_steps(optimizer: Any) -> None:
    """After loading: give every parameter of torch's Adam its own ``step`` tensor. Megatron 0.16's
    distributed optimizer loads one ``step`` tensor into every parameter's state; torch would then
    increment that shared tensor once per parameter, and the bias correction would go wrong."""
    for inner in _inner_optimizers(optimizer):
        _complete_steps(inner)


def _complete_steps(inner: Any) -> None:
    """Give each parameter state of torch's Adam a ``step`` tensor of its own (0 where it has none)."""
    if not _keeps_step_per_parameter(inner):
        return
    for group in inner.param_groups:
        for param in group["params"]:
            state = inner.state[param]
            if not state:
                continue
            step = state.get("step")
            state["step"] = _zero_step(group, param) if step is None else step.clone()
