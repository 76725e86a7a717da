"""plasmid-sft's loss against the loss contract."""

from __future__ import annotations

import plasmid_sft.plugin

from plasmid_torch.testing.contracts.loss import LossContract


class TestSFTContract(LossContract):
    plugin = plasmid_sft.plugin
    provider = "sft"
