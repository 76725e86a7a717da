"""The device and precision a plain-PyTorch provider runs in, from :class:`DeviceOptions`
(imports torch).

:func:`placement` resolves ``--device`` once, at start-up: ``auto`` is ``cuda`` when torch sees a
GPU, else ``cpu``; ``cuda`` without a GPU is a one-line :class:`plasmid.errors.UsageError`. A
process of a multi-rank trainer uses the GPU of its ``LOCAL_RANK`` (default 0). The
:class:`Placement` loads models (:meth:`Placement.load_causal_lm`: on the device, in the
parameter dtype of ``--precision``, with ``--attn-implementation``) and gives the context that
forward passes run in (:meth:`Placement.autocast`: bfloat16 autocast for ``bf16-autocast``,
nothing otherwise). With the defaults on a machine without a GPU (``cpu``, ``fp32``,
transformers' attention) a model is loaded exactly as :func:`plasmid_torch.hf.load_causal_lm`
loads it, so CPU runs are bit-identical to runs before these options existed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from plasmid.errors import UsageError
from plasmid_torch.device_options import DeviceOptions


def resolve_device(choice: str, where: str) -> torch.device:
    """The ``torch.device`` of ``--device choice`` for provider ``where``.

    :raises UsageError: ``cuda`` asked for where torch sees no GPU (one line, naming ``where``).
    """
    if choice not in ("auto", "cpu", "cuda"):
        raise UsageError(f"{where}: --device {choice}: expected auto, cpu or cuda")
    available = torch.cuda.is_available()
    if choice == "cpu" or (choice == "auto" and not available):
        return torch.device("cpu")
    if not available:
        raise UsageError(f"{where}: --device cuda, but torch {torch.__version__} sees no CUDA GPU "
                         f"(torch.cuda.is_available() is false); use --device cpu or auto")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    return torch.device("cuda", index)


@dataclass(frozen=True)
class Placement:
    """Where a provider computes and in which precision.

    :ivar device: the resolved device.
    :ivar precision: ``fp32``, ``bf16`` or ``bf16-autocast`` (``--precision``).
    :ivar attn_implementation: passed to transformers; ``None`` lets it choose (sdpa where the
        model supports it).
    """

    device: torch.device
    precision: str = "fp32"
    attn_implementation: str | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def param_dtype(self) -> torch.dtype:
        """Parameters' dtype: bfloat16 for ``bf16``, float32 otherwise (``bf16-autocast`` keeps
        float32 master weights)."""
        return torch.bfloat16 if self.precision == "bf16" else torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype matrix products run in: float32 for ``fp32``, bfloat16 otherwise."""
        return torch.float32 if self.precision == "fp32" else torch.bfloat16

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context of a forward pass: bfloat16 autocast on the device for ``bf16-autocast``,
        a no-op context otherwise."""
        if self.precision == "bf16-autocast":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def load_causal_lm(self, path: str) -> Any:
        """``AutoModelForCausalLM`` from local directory ``path``: eval mode, :attr:`param_dtype`,
        on :attr:`device`, with :attr:`attn_implementation` (when set)."""
        from plasmid_torch.hf import load_causal_lm

        if self.attn_implementation is None:
            model = load_causal_lm(path, str(self.param_dtype).removeprefix("torch."))
        else:
            model = _load_with_attention(path, self.param_dtype, self.attn_implementation)
        return model.to(self.device) if self.device.type != "cpu" else model

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on :attr:`device` (the same tensor when it is there already)."""
        return tensor.to(self.device, non_blocking=True) if tensor.device != self.device else tensor

    def adamw(self, parameters: Iterator[torch.nn.Parameter] | list[torch.nn.Parameter], **settings: Any
              ) -> torch.optim.AdamW:
        """``torch.optim.AdamW(parameters, **settings)``, fused: one kernel per parameter on the
        CPU (a third of the for-each implementation's time on the quickstart's model: 0.19 vs
        0.67 ms a step), one per step on CUDA."""
        return torch.optim.AdamW(parameters, **{**settings, "fused": True})


def _load_with_attention(path: str, dtype: torch.dtype, attn_implementation: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from plasmid_torch.hf import _check_model_dir, model_class

    directory = _check_model_dir(path)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        model = model_class(directory).from_pretrained(str(directory), dtype=dtype,
                                                       attn_implementation=attn_implementation)
    except (ValueError, ImportError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"--attn-implementation {attn_implementation}: the model at {path} cannot use it "
                         f"({first})") from None
    return model.eval()


def placement(options: DeviceOptions, where: str) -> Placement:
    """The :class:`Placement` of the run's ``--device``/``--precision``/``--attn-implementation``
    for provider ``where`` (named in errors)."""
    return Placement(resolve_device(options.device, where), options.precision, options.attn_implementation)


def enable_gradient_checkpointing(model: Any) -> int:
    """Recompute each transformer layer's activations in the backward pass instead of keeping
    them (transformers' ``activation_checkpointing_enable``, non-reentrant).

    Transformers checkpoints a layer only while that layer is in training mode; the trainers keep
    their models in eval mode (no dropout, deterministic log-probs), so only the checkpointed
    layer modules themselves are flagged as training (not their children: attention dropout and
    any other dropout stay off). Gradients and losses equal those without checkpointing up to
    float rounding. Returns the number of checkpointed layers.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    settings = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):      # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=settings)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=settings)
    layers = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    for layer in layers:
        layer.training = True
    return len(layers)


def offload_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Keep ``optimizer``'s per-parameter state (AdamW moments) in CPU memory between steps: a
    pre-step hook moves it to each parameter's device, a post-step hook back to the CPU, so the
    GPU holds it only during ``optimizer.step()`` (not during forward and backward passes, where
    the activation peak is). For parameters on a GPU (``--optimizer-offload``); on CPU parameters
    the hooks move nothing."""

    def move(to_param_device: bool) -> None:
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                state = optimizer.state.get(parameter)
                if not state:
                    continue
                target = parameter.device if to_param_device else torch.device("cpu")
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != target:
                        state[key] = value.to(target, non_blocking=not to_param_device)

    optimizer.register_step_pre_hook(lambda *_: move(True))
    optimizer.register_step_post_hook(lambda *_: move(False))


__all__ = ["Placement", "enable_gradient_checkpointing", "offload_optimizer_state", "placement", "resolve_device"]
