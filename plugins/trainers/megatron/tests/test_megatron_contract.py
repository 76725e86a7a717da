"""plasmid-megatron against the trainer contract (world size 1, CPU), on a tiny Qwen2 (tied
embeddings, QKV bias) and a tiny Llama (separate lm_head, grouped-query attention, and a reference
model for the loss's KL term)."""

from __future__ import annotations

import plasmid_megatron.plugin

from plasmid_torch.testing.contracts.trainer import ContractLoss, TrainerContract


class TestMegatronContract(TrainerContract):
    plugin = plasmid_megatron.plugin
    provider = "megatron"
    config_options = {"trainer": "megatron"}


class TestMegatronLlamaContract(TrainerContract):
    plugin = plasmid_megatron.plugin
    provider = "megatron"
    contract_loss = ContractLoss(kl_coef=0.05)
    model_options = {"arch": "llama", "tie_word_embeddings": False, "num_kv_heads": 2}
    config_options = {"trainer": "megatron", "micro_batch_size": 3}
