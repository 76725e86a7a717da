"""plasmid-torchtrain against the trainer contract, on a tiny Qwen2 (tied embeddings) and a
tiny Llama (separate lm_head)."""

from __future__ import annotations

import plasmid_grpo.plugin
import plasmid_torchtrain.plugin
import pytest
import torch

from plasmid_torch.testing.contracts.trainer import TrainerContract


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class TestTorchtrainContract(TrainerContract):
    plugin = plasmid_torchtrain.plugin
    provider = "torchtrain"
    loss_plugin = plasmid_grpo.plugin


class TestTorchtrainLlamaContract(TrainerContract):
    plugin = plasmid_torchtrain.plugin
    provider = "torchtrain"
    loss_plugin = plasmid_grpo.plugin
    model_options = {"arch": "llama", "tie_word_embeddings": False, "num_kv_heads": 2}
    config_options = {"kl_loss_coef": 0.05, "micro_batch_size": 3}
