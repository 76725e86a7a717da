"""The options of the ``torchtrain`` trainer alone (the "torchtrain" group). The device and
precision options it shares with ``torchgen`` are :class:`plasmid_torch.device_options.DeviceOptions`;
the optimizer and batching ones every trainer shares are :class:`plasmid_torch.trainer_options.TrainerOptions`.
"""

from __future__ import annotations

from typing import Literal

from plasmid.errors import UsageError
from plasmid.options import Options, option

#: the CPU mmap threshold of full fine-tuning: SmolLM2-135M, two steps of 32 samples, packed micro-batches of
#: 2,048 tokens with gradient checkpointing (2026-12-07, 2 cores): 3.8 GB peak, 27-34 s a step; 256 KiB gave
#: 3.4 GB at 32-38 s
MMAP_THRESHOLD_FULL = 4 << 20
#: the CPU mmap threshold of a LoRA run: the adapters' hidden-sized temporaries (1-4 MiB at these micro-batches)
#: left 1.4 GB of freed heap resident at 4 MiB (3.2 GB peak, 32 s a step); 1 MiB: 1.9 GB, 44 s
MMAP_THRESHOLD_LORA = 1 << 20


class TorchtrainOptions(Options, group="torchtrain", description="the plain-PyTorch trainer (--trainer torchtrain)"):
    """Memory savers and data-parallel layout of the torch trainer."""

    torchtrain_sharding: Literal["fsdp", "replicate"] = option(
        "fsdp", "with several trainer workers (--trainer-workers): fsdp shards parameters, gradients and AdamW state "
        "over the ranks (torch FSDP2 fully_shard); replicate keeps a whole copy on each rank and all-reduces "
        "gradients")

    torchtrain_packing: bool = option(
        True, "pack a micro-batch's samples into one row without padding (attention kept within each sample; "
        "plasmid_torch.packing), a prompt that several samples share packed once, when that feeds fewer token "
        "positions than padding them or sharing their prompts' passes on a KV cache; models with sliding-window "
        "layers or --attn-implementation eager are never packed")
    freeze_vision_tower: bool = option(
        False, "vision-language policies: leave the vision tower (the image encoder and its merger into the text "
        "model) out of training, no gradient and no optimizer state, as for a pretrained VLM whose image features "
        "should stay as they are; off by default because a VLM built from scratch (the tiny one of --task "
        "colours) must learn to see; ignored for a text-only model")
    gradient_checkpointing: bool = option(False, "recompute each transformer layer's activations in the backward "
                                          "pass instead of keeping them (less memory, ~1/3 more compute)")
    lora_rank: int = option(0, "train LoRA adapters of this rank instead of every weight (0: full training; needs "
                            "peft: pip install 'plasmid-torchtrain[lora]')", min=0)
    lora_alpha: float = option(16.0, "LoRA scale numerator (the adapters' update is scaled by alpha / rank)", gt=0)
    lora_dropout: float = option(0.0, "dropout on the adapters' inputs in the policy's training forward passes",
                                 min=0, max=1)
    lora_target_modules: tuple[str, ...] = option((), "module names to adapt (repeat the flag: q_proj, v_proj, ...)",
                                                  default_text="every linear layer but the LM head")
    torchtrain_mmap_threshold: int | None = option(
        None, "on the CPU: allocations of at least this many bytes get a memory mapping of their own, returned to "
        "the system when freed (glibc's mmap threshold, fixed: plasmid_torch.heap); lower keeps less resident memory "
        "at the cost of page faults (SmolLM2-135M train step, full fine-tuning: 4.55 GB peak with glibc's adaptive "
        "threshold, 3.8 at 4 MiB, 3.4 at 256 KiB and ~20% slower; LoRA: 3.2 GB at 4 MiB, 1.9 at 1 MiB and ~35% "
        "slower); 0: glibc's adaptive threshold", min=0,
        default_text="4 MiB; 1 MiB with --lora-rank, where the adapters' temporaries fragment the heap")
    optimizer_offload: bool = option(False, "keep the AdamW state in CPU memory between optimizer steps (CUDA only: "
                                     "with --device cuda)")

    def mmap_threshold(self) -> int:
        """The glibc mmap threshold to fix on the CPU (bytes; 0: leave glibc's adaptive one): the option, or
        the default for this run (:data:`MMAP_THRESHOLD_FULL`, :data:`MMAP_THRESHOLD_LORA` with LoRA)."""
        if self.torchtrain_mmap_threshold is not None:
            return self.torchtrain_mmap_threshold
        return MMAP_THRESHOLD_LORA if self.lora_rank else MMAP_THRESHOLD_FULL

    def check_device(self, device_type: str) -> None:
        """:raises UsageError: ``--optimizer-offload`` on a CPU device (there is no GPU memory to save)."""
        if self.optimizer_offload and device_type != "cuda":
            raise UsageError(f"torchtrain: --optimizer-offload keeps the optimizer state off the GPU, but the trainer "
                             f"runs on {device_type} (--device); drop the flag or use --device cuda")


__all__ = ["TorchtrainOptions"]
