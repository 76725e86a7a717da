"""The options of the ``torchgen`` engine."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class TorchgenOptions(Options, group="torchgen", description="the embedded PyTorch rollout engine (--engine torchgen)"):
    torchgen_max_batch_size: int = option(1024, "most requests decoded together; later ones wait and join as rows "
                                          "finish", min=1)
    torchgen_decoder: Literal["lean", "hf"] = option(
        "lean", "decoding step: lean (our own step over the model's weights with a preallocated KV cache, for "
        "qwen2/llama/qwen3 with sdpa attention; other models fall back to hf) or hf (the Hugging Face forward); "
        "both give the same tokens and log-probs on the CPU")
