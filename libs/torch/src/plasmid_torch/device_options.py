"""Where and in which precision the plain-PyTorch providers run (the "device" group), declared by
``torchtrain`` and ``torchgen`` alike: one ``--device`` and one ``--precision`` for both, so the
engine samples with the numerics the trainer trains with.

This module imports no torch (plugins import it when they declare options);
:mod:`plasmid_torch.device` turns the values into a device, a dtype and an autocast context.
"""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option

#: ``--precision`` choices: float32 everywhere; bfloat16 parameters (and AdamW states); float32
#: (master) parameters with the forward passes under bfloat16 autocast.
PRECISIONS = ("fp32", "bf16", "bf16-autocast")


class DeviceOptions(Options, group="device", description="device and precision of torchtrain and torchgen"):
    """``--device``, ``--precision`` and ``--attn-implementation`` (read by
    :func:`plasmid_torch.device.placement`)."""

    device: Literal["auto", "cpu", "cuda"] = option("auto", "where torchtrain and torchgen compute: auto picks "
                                                    "cuda when torch sees a GPU, else cpu")
    precision: Literal["fp32", "bf16", "bf16-autocast"] = option(
        "fp32", "fp32; bf16 (bfloat16 weights and optimizer state); bf16-autocast (float32 master weights, forward "
        "passes under bfloat16 autocast)")
    attn_implementation: str | None = option(None, "transformers' attn_implementation for the model (sdpa, eager, "
                                             "flash_attention_2, ...)", default_text="transformers' choice: sdpa "
                                             "where the model supports it, else eager")


__all__ = ["PRECISIONS", "DeviceOptions"]
