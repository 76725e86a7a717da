"""plasmid-megatron against the trainer contract (world size 1, CPU), on a tiny Qwen2 (tied
embeddings, QKV bias) and a tiny Llama (separate lm_head, grouped-query attention)."""

from __future__ import annotations

import plasmid_grpo.plugin
import plasmid_megatron.plugin

from plasmid_torch.testing.contracts.trainer import TrainerContract


class TestMegatronContract(TrainerContract):
    plugin = plasmid_megatron.plugin
    provider = "megatron"
    loss_plugin = plasmid_grpo.plugin
    config_options = {"trainer": "megatron"}


class TestMegatronLlamaContract(TrainerContract):
    plugin = plasmid_megatron.plugin
    provider = "megatron"
    loss_plugin = plasmid_grpo.plugin
    model_options = {"arch": "llama", "tie_word_embeddings": False, "num_kv_heads": 2}
    config_options = {"trainer": "megatron", "kl_loss_coef": 0.05, "micro_batch_size": 3}
