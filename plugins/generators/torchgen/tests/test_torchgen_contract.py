"""torchgen meets the rollout-engine contract of the kernel (plasmid.testing.GeneratorContract), images included."""

import plasmid_torchgen.plugin
import torch

from plasmid.testing import GeneratorContract

torch.set_num_threads(1)


class TestTorchgenEngineContract(GeneratorContract):
    plugin = plasmid_torchgen.plugin
    provider = "torchgen"
    multimodal = True
