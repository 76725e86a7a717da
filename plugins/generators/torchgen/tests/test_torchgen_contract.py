"""torchgen meets the rollout-engine contract of the kernel (plasmid.testing.GeneratorContract)."""

import torch

import plasmid_torchgen.plugin
from plasmid.testing import GeneratorContract

torch.set_num_threads(1)


class TestTorchgenEngineContract(GeneratorContract):
    plugin = plasmid_torchgen.plugin
    provider = "torchgen"
