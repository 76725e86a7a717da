"""The options of the ``torchtrain`` trainer alone (the "torchtrain" group). The device and
precision options it shares with ``torchgen`` are :class:`plasmid_torch.device_options.DeviceOptions`;
the optimizer and batching ones every trainer shares are :class:`plasmid_torch.trainer_options.TrainerOptions`.
"""

from __future__ import annotations

from plasmid.errors import UsageError
from plasmid.options import Options, option


class TorchtrainOptions(Options, group="torchtrain", description="the plain-PyTorch trainer (--trainer torchtrain)"):
    """Memory savers of the torch trainer."""

    gradient_checkpointing: bool = option(False, "recompute each transformer layer's activations in the backward "
                                          "pass instead of keeping them (less memory, ~1/3 more compute)")
    optimizer_offload: bool = option(False, "keep the AdamW state in CPU memory between optimizer steps (CUDA only: "
                                     "with --device cuda)")

    def check_device(self, device_type: str) -> None:
        """:raises UsageError: ``--optimizer-offload`` on a CPU device (there is no GPU memory to save)."""
        if self.optimizer_offload and device_type != "cuda":
            raise UsageError(f"torchtrain: --optimizer-offload keeps the optimizer state off the GPU, but the trainer "
                             f"runs on {device_type} (--device); drop the flag or use --device cuda")


__all__ = ["TorchtrainOptions"]
