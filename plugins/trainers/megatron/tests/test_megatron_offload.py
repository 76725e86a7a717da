"""Offload/onload of the trainer's device memory (colocate mode): storages freed to zero bytes,
every tensor and view restored bit for bit, training afterwards identical to never offloading.

The trainer calls the stash only on CUDA (on the CPU the host copy would free nothing); the
mechanism is device-agnostic, so these tests drive it on the CPU directly.
"""

from __future__ import annotations

import plasmid_grpo.plugin
import plasmid_megatron.plugin
import pytest
import torch
from plasmid_megatron.offload import MemoryStash, optimizer_tensors

from plasmid import testing
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch

VOCAB = 16
CPU = torch.device("cpu")


def test_stash_frees_storages_and_restores_tensors_and_views():
    weights = torch.randn(4, 8)
    view = weights[1:3]
    moments = torch.randn(16)
    grads = torch.randn(32)
    original = weights.clone(), moments.clone()
    stash = MemoryStash(lambda: ([weights, view, moments], [grads]), device=CPU)
    freed = stash.offload()
    assert freed == (32 + 16 + 32) * 4
    assert all(t.untyped_storage().nbytes() == 0 for t in (weights, view, moments, grads))
    assert stash.offload() == 0, "offloading twice frees nothing more"
    stash.onload()
    assert torch.equal(weights, original[0]) and torch.equal(moments, original[1])
    assert torch.equal(grads, torch.zeros(32)), "discarded storages come back as zeros"
    view.fill_(7.0)
    assert torch.equal(weights[1:3], torch.full((2, 8), 7.0)), "views still share the restored storage"
    assert not stash.offloaded


def test_a_storage_both_kept_and_discarded_is_kept():
    shared = torch.arange(6, dtype=torch.float32)
    stash = MemoryStash(lambda: ([shared[:3]], [shared[3:]]), device=CPU)
    stash.offload()
    stash.onload()
    assert torch.equal(shared, torch.arange(6, dtype=torch.float32))


def make_trainer(model_dir, tmp_path, **options):
    torch.set_num_threads(1)
    config = testing.make_config(plasmid_megatron.plugin, plasmid_grpo.plugin, trainer="megatron", lr=1e-2,
                                 model=str(model_dir), run_dir=tmp_path / "run", kl_loss_coef=0.05, **options)
    loss = testing.build("loss", "grpo", plasmid_grpo.plugin, config=config)
    return testing.build("trainer", "megatron", plasmid_megatron.plugin, config=config, args=(loss,))


@pytest.mark.parametrize("distributed", [False, True], ids=["adam", "distributed-adam"])
def test_training_after_offload_and_onload_equals_training_without(model_dir, tmp_path, distributed):
    options = {"megatron_use_distributed_optimizer": True} if distributed else {}
    offloaded, kept = make_trainer(model_dir, tmp_path, **options), make_trainer(model_dir, tmp_path, **options)
    first, second = make_rollout_batch(VOCAB, groups=3, seed=1), make_rollout_batch(VOCAB, groups=3, seed=2)
    for trainer in (offloaded, kept):
        testing.run(trainer.train_step(first))       # Adam now has moments to lose

    freed = offloaded._run(offloaded.memory.offload)
    weights = list(offloaded.model.parameters()) + list(offloaded.ref_model.parameters())
    state = optimizer_tensors(offloaded.optimizer)
    assert all(t.untyped_storage().nbytes() == 0 for t in weights + state)
    parameter_bytes = sum(p.numel() * p.element_size() for p in offloaded.model.parameters())
    assert freed >= 4 * parameter_bytes, "weights, reference weights and two Adam moments at least"
    offloaded._run(offloaded.memory.onload)

    got, expected = testing.run(offloaded.train_step(second)), testing.run(kept.train_step(second))
    for name in ("train/loss", "train/grad_norm", "train/kl_loss"):
        assert got[name] == expected[name], name
    after, reference = exported(offloaded), exported(kept)
    assert all((after[name] == reference[name]).all() for name in reference)
