"""A MoE policy's weights leave torchtrain in the checkpoint layout (one tensor per expert and
projection, as ``save_pretrained`` writes them and SGLang, vLLM and Megatron name them), although its
transformers 5 module holds the experts fused; torchgen takes them back into its fused tensors."""

from __future__ import annotations

import plasmid_grpo.plugin
import plasmid_torchgen.plugin
import plasmid_torchtrain.plugin
import pytest
import torch
from safetensors.torch import load_file

from plasmid import testing
from plasmid_torch.tiny import BOS_ID, build_tiny_model


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_a_moe_policy_exports_the_checkpoint_layout_and_torchgen_loads_it(arch, tmp_path):
    model_dir = build_tiny_model(tmp_path / "policy", arch=arch, seed=0)
    other_dir = build_tiny_model(tmp_path / "other", arch=arch, seed=1)
    config = testing.make_config(plasmid_torchtrain.plugin, plasmid_grpo.plugin, model=str(other_dir),
                                 run_dir=tmp_path / "run", lr=1e-3)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    trainer = testing.build("trainer", "torchtrain", plasmid_torchtrain.plugin, config=config, args=(loss,))
    exported = [pair for bucket in trainer.export_weights(1 << 16) for pair in bucket]
    on_disk = load_file(other_dir / "model.safetensors")
    assert [name for name, _ in exported if name in on_disk] == [name for name, _ in exported]
    assert {name for name, _ in exported} == set(on_disk)
    assert all(torch.equal(tensor, on_disk[name]) for name, tensor in exported)

    engine_config = testing.make_config(plasmid_torchgen.plugin, model=str(model_dir), run_dir=tmp_path / "engine")
    engine = testing.build("engine", "torchgen", plasmid_torchgen.plugin, config=engine_config)
    reference = testing.build("engine", "torchgen", plasmid_torchgen.plugin,
                              config=testing.make_config(plasmid_torchgen.plugin, model=str(other_dir),
                                                         run_dir=tmp_path / "reference"))
    tokens = [BOS_ID, 4, 7, 9, 5, 3]
    try:
        for bucket in trainer.export_weights(1 << 16):
            testing.run(engine.update_weights(bucket, weight_version=1))
        assert testing.run(engine.score(tokens, 2, 1.0)) == testing.run(reference.score(tokens, 2, 1.0))
    finally:
        testing.run(engine.shutdown())
        testing.run(reference.shutdown())
