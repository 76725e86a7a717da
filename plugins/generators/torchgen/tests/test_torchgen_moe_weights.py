"""Weight syncs into a MoE model: torchgen's fused expert tensors (transformers 5) take the checkpoint
layout that Megatron's export, torchtrain's export and checkpoints send (:mod:`plasmid_torch.expert_layout`)."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.torch import load_file

from plasmid.testing import run
from plasmid_torch.tiny import BOS_ID, build_tiny_model


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_a_checkpoint_layout_sync_updates_the_fused_experts(make_engine, arch, tmp_path):
    """What Megatron's export and checkpoints send (one tensor per expert and projection) lands in the
    served model's fused expert tensors: after the sync the engine scores exactly as one built from
    the sent weights, and reads them back under the same names."""
    served = build_tiny_model(tmp_path / "served", arch=arch, seed=0)
    other = build_tiny_model(tmp_path / "other", arch=arch, seed=1)
    sent = load_file(other / "model.safetensors")
    assert any(".mlp.experts.0.gate_proj.weight" in name for name in sent)
    engine, reference = make_engine(served), make_engine(other)
    tokens = [BOS_ID, 4, 7, 9, 5, 3]
    before = run(engine.score(tokens, 2, 1.0))
    run(engine.update_weights(list(sent.items()), weight_version=1))
    after, expected = run(engine.score(tokens, 2, 1.0)), run(reference.score(tokens, 2, 1.0))
    assert after == expected and after != before
    name = next(name for name in sent if name.endswith("experts.1.up_proj.weight"))
    assert np.array_equal(run(engine.get_weights([name]))[name], sent[name].numpy())


def test_sharing_serves_same_dtype_tensors_in_place_and_copies_the_rest(make_engine, tmp_path):
    """``share_weights``: a tensor of the served dtype becomes the engine's own (same storage; the
    engine's copy dropped); one of another dtype and the experts' checkpoint-layout views are copied;
    a wrong shape changes nothing."""
    import torch

    served = build_tiny_model(tmp_path / "served", arch="qwen3_moe", seed=0)
    sent = load_file(build_tiny_model(tmp_path / "other", arch="qwen3_moe", seed=1) / "model.safetensors")
    engine = make_engine(served)
    dense = next(name for name in sent if name.endswith("self_attn.q_proj.weight"))
    expert = next(name for name in sent if name.endswith("experts.1.up_proj.weight"))
    half = next(name for name in sent if name.endswith("self_attn.k_proj.weight"))
    sent[half] = sent[half].double()
    bad = {dense: torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="shape"):
        run(engine.share_weights(list(bad.items()), 5))
    assert engine.weight_version != 5
    shared = run(engine.share_weights([(dense, sent[dense]), (expert, sent[expert]), (half, sent[half])], 5))
    table = engine._weights
    assert shared == sent[dense].numel() * 4 and engine.weight_version == 5 and table.storage_moves == 1
    assert run(engine.share_weights([(dense, sent[dense])], 6)) == shared and table.storage_moves == 1
    assert table.tensors[dense].data_ptr() == sent[dense].data_ptr()             # served in place
    assert table.tensors[half].data_ptr() != sent[half].data_ptr()               # another dtype: copied
    assert torch.equal(table.tensors[half], sent[half].float())
    assert np.array_equal(run(engine.get_weights([expert]))[expert], sent[expert].numpy())
    with torch.no_grad():
        sent[dense].mul_(2.0)
    assert torch.equal(table.tensors[dense], sent[dense])
