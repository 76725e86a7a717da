"""plasmid-torchtrain against the trainer contract, on a tiny Qwen2 (tied embeddings; images too, on the
tiny Qwen2-VL) and a tiny Llama (separate lm_head, and a reference model for the loss's KL term)."""

from __future__ import annotations

import plasmid_torchtrain.plugin

from plasmid_torch.testing.contracts.trainer import ContractLoss, TrainerContract


class TestTorchtrainContract(TrainerContract):
    plugin = plasmid_torchtrain.plugin
    provider = "torchtrain"
    multimodal = True


class TestTorchtrainLlamaContract(TrainerContract):
    plugin = plasmid_torchtrain.plugin
    provider = "torchtrain"
    contract_loss = ContractLoss(kl_coef=0.05)
    model_options = {"arch": "llama", "tie_word_embeddings": False, "num_kv_heads": 2}
    config_options = {"micro_batch_size": 3}
