"""plasmid-sft's options."""

from __future__ import annotations

from plasmid.options import Options, option


class SFTOptions(Options, group="sft", description="supervised fine-tuning on the labels (--loss sft, "
                                                   "--generate sft)"):
    sft_append_stop: bool = option(True, "end each demonstration with the stop token (the tokenizer's "
                                   "end-of-sequence) when it fits within --max-new-tokens")
