"""LoRA adapters on the policy through ``peft`` (``--lora-rank R`` > 0; peft is an optional
dependency: ``pip install 'plasmid-torchtrain[lora]'``).

- :func:`add_adapters` wraps the loaded causal LM in a ``peft`` model: the base weights are frozen,
  only the adapters (``lora_A``/``lora_B`` of ``--lora-target-modules``, default every linear layer
  but the LM head) train, so the optimizer holds state for the adapters alone.
- The reference policy is the same model with its adapters disabled (:class:`AdaptersDisabled`):
  no second copy of the weights.
- :func:`merged_tensors` is what weight syncs send: every tensor under its Hugging Face name, a
  LoRA-wrapped linear layer's weight merged (``W + scale * B @ A``, computed out of place, so the
  trained base weights are never rounded by merging and unmerging). An engine therefore needs no
  adapter support (sending adapters alone to an engine that can load them is not done here).
  Of an FSDP2-sharded policy (:func:`plasmid_torchtrain.distributed.shard_model`) the merged
  tensors are sharded DTensors, gathered whole one at a time when their bucket is copied.
- :meth:`plasmid_torchtrain.trainer.TorchTrainer.save_adapters` writes them alone (peft's format)
  for an engine that loads adapters (plasmid-vllm's ``--weight-sync vllm-lora``).
- Checkpoints hold the adapters (``adapter/`` in peft's format, :func:`save_adapters`, from the
  adapters gathered whole, :func:`adapter_state`) beside the merged model directory
  (:func:`plasmid_torchtrain.checkpoint.write_adapters`).

The trainer keeps its model in eval mode; ``--lora-dropout`` applies to the adapters' inputs in
the policy's forward passes with gradient (:func:`dropout_active`), never in log-prob passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from plasmid.errors import UsageError

ADAPTER_SUBDIR = "adapter"
ADAPTER = "default"


def add_adapters(model: Any, *, rank: int, alpha: float, dropout: float, target_modules: tuple[str, ...]) -> Any:
    """``model`` wrapped in a peft LoRA model (base weights frozen, adapters trainable)."""
    try:
        import peft
    except ImportError:
        raise UsageError("torchtrain: --lora-rank needs peft, which is not installed: pip install "
                         "'plasmid-torchtrain[lora]' (or pip install peft)") from None
    targets: Any = list(target_modules) if target_modules else "all-linear"
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    try:
        wrapped = peft.get_peft_model(model, config)
    except ValueError as error:
        raise UsageError(f"torchtrain: --lora-target-modules {' '.join(target_modules) or 'all-linear'}: "
                         f"{str(error).splitlines()[0]}") from None
    return wrapped.eval()


def merged_tensors(model: Any, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """``names`` (the base model's HF names, as listed before wrapping) with their current values:
    a LoRA-wrapped layer's ``weight`` merged with its adapter, everything else as is."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    with torch.no_grad():
        for name in names:
            path, _, leaf = name.rpartition(".")
            module = base.get_submodule(path) if path else base
            if isinstance(module, LoraLayer):
                tensor = getattr(module.get_base_layer(), leaf)
                if leaf == "weight" and ADAPTER in module.lora_A:
                    tensor = tensor + module.get_delta_weight(ADAPTER).to(tensor.dtype)
            else:
                tensor = getattr(module, leaf)
            yield name, tensor.detach()


def adapter_parameters(model: Any) -> dict[str, torch.Tensor]:
    """The trainable (adapter) parameters by name (an FSDP2-sharded model's: sharded DTensors)."""
    return {name: parameter for name, parameter in model.named_parameters() if parameter.requires_grad}


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """The adapters, whole, as CPU copies under the peft model's state-dict names
    (``base_model.model.<module>.lora_A.default.weight``): of a sharded model each gathered from
    every rank (a collective call: every rank calls it and receives them). Adapters are small (rank
    ``r`` times the adapted layers' widths), so all of them are held at once."""
    from plasmid_torchtrain.distributed import full

    with torch.no_grad():
        return {name: full(parameter).detach().to("cpu", copy=True)
                for name, parameter in adapter_parameters(model).items()}


class AdaptersDisabled:
    """The reference policy of a LoRA run: ``model`` with its adapters disabled (the base weights)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)


@contextlib.contextmanager
def dropout_active(model: Any) -> Iterator[None]:
    """The adapters' dropout modules in training mode for the duration (the rest stays in eval)."""
    dropouts = [module for name, module in model.named_modules()
                if "lora_dropout" in name and isinstance(module, torch.nn.Dropout) and module.p > 0]
    for module in dropouts:
        module.train()
    try:
        yield
    finally:
        for module in dropouts:
            module.eval()


def save_adapters(model: Any, directory: Path, state: dict[str, torch.Tensor]) -> None:
    """The adapters ``state`` (:func:`adapter_state`) and their config in peft's format
    (``adapter_model.safetensors``, ``adapter_config.json``; loads with ``PeftModel.from_pretrained``,
    and into engines that load LoRA adapters, such as vLLM's ``/v1/load_lora_adapter``) in
    ``directory``. Called by one process."""
    model.save_pretrained(str(directory), state_dict=state)


def check_adapters(checkpoint_dir: str | Path, *, lora: bool) -> None:
    """:raises FileNotFoundError: a LoRA trainer (``lora``) resumes a checkpoint without adapters.
    :raises ValueError: a full-training trainer resumes a checkpoint of LoRA adapters."""
    file = Path(checkpoint_dir) / ADAPTER_SUBDIR / "adapter_model.safetensors"
    if lora and not file.is_file():
        raise FileNotFoundError(f"{file} is missing: checkpoint {checkpoint_dir} holds no LoRA adapters (it was "
                                f"written without --lora-rank); resume with the same --lora-* options")
    if not lora and file.is_file():
        raise ValueError(f"checkpoint {checkpoint_dir} holds LoRA adapters ({file.parent.name}/): it was written "
                         f"with --lora-rank; resume with the same --lora-* options")


def load_adapters(model: Any, checkpoint_dir: str | Path) -> None:
    """Copy the adapters saved in checkpoint ``checkpoint_dir`` into ``model`` (a checkpoint of one
    rank written before LoRA checkpoints had ``dcp/``)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    check_adapters(checkpoint_dir, lora=True)
    file = Path(checkpoint_dir) / ADAPTER_SUBDIR / "adapter_model.safetensors"
    result = set_peft_model_state_dict(model, load_file(str(file)))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"checkpoint {checkpoint_dir}: adapters {unexpected[:3]} do not fit the --lora-* options")
