"""Fused MoE experts (transformers 5 modules) and the checkpoint layout (one tensor per expert and
projection): :mod:`plasmid_torch.expert_layout` against what ``save_pretrained`` itself writes."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file

from plasmid_torch.expert_layout import checkpoint_layout, expert_views
from plasmid_torch.tiny import build_tiny_model


@pytest.fixture(scope="module", params=["qwen2_moe", "qwen3_moe"])
def moe_dir(request, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp(request.param) / "model", arch=request.param)


def module_state(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()


def test_the_checkpoint_layout_of_a_fused_module_is_what_save_pretrained_writes(moe_dir):
    state = module_state(moe_dir)
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in state)          # the module is fused
    on_disk = load_file(moe_dir / "model.safetensors")
    split = dict(checkpoint_layout(state.items()))
    assert on_disk.keys() <= split.keys() and split.keys() - on_disk.keys() <= {"lm_head.weight"}  # tied: not saved
    assert all(torch.equal(split[name], on_disk[name]) for name in on_disk)
    assert expert_views(state).keys() == {name for name in on_disk if ".mlp.experts." in name}


def test_writing_an_expert_view_writes_that_slice_of_the_fused_tensor_only(moe_dir):
    state = module_state(moe_dir)
    fused = state["model.layers.0.mlp.experts.gate_up_proj"]
    before = fused.clone()
    up = expert_views(state)["model.layers.0.mlp.experts.1.up_proj.weight"]
    up.copy_(torch.full_like(up, 7.0))
    half = fused.shape[1] // 2
    assert torch.equal(fused[1, half:], torch.full_like(up, 7.0))
    changed = torch.zeros_like(fused, dtype=torch.bool)
    changed[1, half:] = True
    assert torch.equal(fused[~changed], before[~changed])


def test_a_dense_model_passes_through(tmp_path):
    state = module_state(build_tiny_model(tmp_path / "dense"))
    assert [name for name, _ in checkpoint_layout(state.items())] == list(state)
    assert expert_views(state) == {}
