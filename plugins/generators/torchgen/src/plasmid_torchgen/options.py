"""The option of the ``torchgen`` engine."""

from __future__ import annotations

from plasmid.options import Options, option


class TorchgenOptions(Options, group="torchgen", description="the embedded PyTorch rollout engine (--engine torchgen)"):
    torchgen_max_batch_size: int = option(1024, "most requests decoded together; later ones wait and join as rows "
                                          "finish", min=1)
