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
    torchgen_cuda_graphs: bool = option(
        False, "replay the lean decoding step as CUDA graphs (one per power-of-two row count; a GPU decoding step "
        "then costs one launch instead of hundreds); needs --device cuda and --torchgen-decoder lean; log-probs "
        "equal the eager step's to float rounding")
