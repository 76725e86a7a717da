"""plasmid-sft's options."""

from __future__ import annotations

from plasmid.options import Options, option


class SFTOptions(Options, group="sft", description="supervised fine-tuning on the labels (--loss sft, "
                                                   "--generate sft)"):
    sft_append_stop: bool = option(True, "end each demonstration with the stop token (the tokenizer's "
                                   "end-of-sequence) when it fits within --max-new-tokens")


class SFTMixOptions(Options, group="sft-mix", description="SFT steps mixed with RL steps in one run (--loss sft-mix)"):
    sft_mix_loss: str = option("grpo", "the RL loss of the steps that are not SFT steps (a registered --loss "
                               "without a critic)", metavar="NAME")
    sft_mix_every: int = option(2, "rollout r is an SFT step on the batch's demonstrations when r + 1 is a "
                                "multiple of N, the others are --sft-mix-loss steps on its samples (2: "
                                "alternate)", min=2)
