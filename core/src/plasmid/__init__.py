"""plasmid: a tiny kernel for RL post-training of LLMs; every behavior is a plugin.

``import plasmid`` is cheap: it imports no torch, ray, sglang or megatron.
"""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

#: Plugin API version: a plugin built for API N works with every kernel whose API is N.
API_VERSION = 1

#: Marker for hook implementations: ``@plasmid.hookimpl def plasmid_rewards(register): ...``
hookimpl = pluggy.HookimplMarker("plasmid")

from plasmid.errors import PlasmidError, PluginError, ProviderError, UsageError  # noqa: E402
from plasmid.types import (  # noqa: E402
    GenerationOutput,
    Group,
    LossBatch,
    RewardParts,
    RolloutBatch,
    Sample,
    SamplingParams,
    Status,
    SyncReport,
    Verdict,
)

__all__ = [
    "API_VERSION",
    "GenerationOutput",
    "Group",
    "LossBatch",
    "PlasmidError",
    "PluginError",
    "ProviderError",
    "RewardParts",
    "RolloutBatch",
    "Sample",
    "SamplingParams",
    "Status",
    "SyncReport",
    "UsageError",
    "Verdict",
    "__version__",
    "hookimpl",
]
