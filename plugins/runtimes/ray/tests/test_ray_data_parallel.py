"""Data-parallel training in Ray actors: two torchtrain workers, each backpropagating its shard
of the batch with losses normalised by the global totals and gradients summed, make the same
update as one worker training the whole batch.

This is the replicated path (``--torchtrain-sharding replicate``: whole gradients all-reduced,
compared here tensor by tensor); the FSDP2 default shards them, and its equality with one process
is tested by plasmid-torchtrain's two-process test, its Ray runs by the quickstart tests."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import plasmid_grpo.plugin  # noqa: E402
import plasmid_torchgen.plugin  # noqa: E402
import plasmid_torchtrain.plugin  # noqa: E402
from plasmid_ray.placement import Placement, Resources  # noqa: E402
from plasmid_ray.trainer import start_trainers  # noqa: E402
from ray import cloudpickle  # noqa: E402

from plasmid import testing  # noqa: E402
from plasmid_torch.testing.contracts.trainer import exported, make_rollout_batch  # noqa: E402
from plasmid_torch.tiny import build_tiny_model  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the functions below run in the actors


def data_parallel_rank(trainer):
    return trainer.dp.rank, trainer.dp.world


def weights_digest(trainer):
    import hashlib

    digest = hashlib.sha256()
    for bucket in trainer.export_weights(1 << 30):
        for name, tensor in bucket:
            digest.update(name.encode())
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def count_forward_rows(trainer):
    """From now on, count the sample rows the policy model forwards in this process, in one padded
    pass per micro-batch (the config turns packing off; sharing a group's prompt,
    ``plasmid_torchtrain.batching``, would forward the distinct prompts as rows of their own)."""
    trainer.rows_forwarded = 0
    trainer.share_prompts = False

    def count(module, args, kwargs):
        trainer.rows_forwarded += int(kwargs["input_ids"].shape[0])

    trainer.model.register_forward_pre_hook(count, with_kwargs=True)


def rows_forwarded(trainer):
    return trainer.rows_forwarded


def last_gradients(trainer):
    """The gradient of the last optimizer update (kept in ``.grad`` until the next one)."""
    return {name: p.grad.numpy().copy() for name, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def config(tmp_path_factory, installed_lock):
    tmp = tmp_path_factory.mktemp("dp")
    model = build_tiny_model(tmp / "tiny")
    # one optimizer update of 12 samples in micro-batches of 5: one worker takes 5 + 5 + 2, each of
    # two workers 5 + 1 of its 6; advantages whitened over the whole batch
    made = testing.make_config(plasmid_grpo.plugin, plasmid_torchtrain.plugin, plasmid_torchgen.plugin,
                               model=str(model), run_dir=tmp / "run", lr=1e-2, micro_batch_size=5,
                               advantage_whiten=True, torchtrain_sharding="replicate",
                               torchtrain_packing=False)
    made.plugin_lock = installed_lock
    return made


def test_two_workers_make_the_same_update_as_one(ray_cluster, config):
    vocab = json.loads((Path(config.option.model) / "config.json").read_text())["vocab_size"]
    batch = make_rollout_batch(vocab, groups=3, group_size=4, seed=5)

    async def scenario():
        one = await start_trainers(config, Placement.unplaced(1, 0, Resources(0.5), Resources(0.5)))
        two = await start_trainers(config, Placement.unplaced(2, 0, Resources(0.5), Resources(0.5)))
        try:
            before = exported(one)
            await asyncio.gather(one.plasmid_call_all(count_forward_rows), two.plasmid_call_all(count_forward_rows))
            metrics_one, metrics_two = await asyncio.gather(one.train_step(batch), two.train_step(batch))
            rows = await one.plasmid_call_all(rows_forwarded), await two.plasmid_call_all(rows_forwarded)
            ranks = await two.plasmid_call_all(data_parallel_rank)
            digests = await two.plasmid_call_all(weights_digest)
            gradients = await one.plasmid_call(last_gradients), await two.plasmid_call(last_gradients)
            return before, exported(one), exported(two), metrics_one, metrics_two, ranks, digests, gradients, rows
        finally:
            await one.shutdown()
            await two.shutdown()

    before, after_one, after_two, metrics_one, metrics_two, ranks, digests, gradients, rows = asyncio.run(scenario())
    gradients_one, gradients_two = gradients
    # one worker forwards all 12 samples once: an exactly on-policy step on one rank takes its old
    # log-probs from the update's own forward (TrainStep.reuses_update_forward); each of two workers
    # forwards its 6 twice (old log-probs, then the update: the reuse is for one rank only)
    assert rows == ([12], [12, 12])
    assert ranks == [(0, 2), (1, 2)], "the two workers must form one data-parallel group"
    assert digests[0] == digests[1], "the ranks diverged: their weights differ after the step"
    assert any(not np.array_equal(before[name], after_one[name]) for name in before), "the step changed nothing"
    # the gradient, summed over the two ranks, is the one worker's
    for name, gradient in gradients_one.items():
        scale = float(np.abs(gradient).max())
        np.testing.assert_allclose(gradients_two[name], gradient, rtol=1e-4, atol=1e-6 * scale, err_msg=name)
    # the weights: Adam's first step is lr * g / (|g| + 1e-8), so where |g| is near 1e-8 a rounding
    # difference of g moves the element by a visible fraction of lr (1e-2): nearly every element
    # equal to 1e-6, every one to 5% of lr
    close = sum(int(np.isclose(after_two[n], after_one[n], rtol=0, atol=1e-6).sum()) for n in after_one)
    assert close / sum(a.size for a in after_one.values()) > 0.999
    for name in after_one:
        np.testing.assert_allclose(after_two[name], after_one[name], rtol=0, atol=5e-4, err_msg=name)
    assert metrics_two["train/updates"] == metrics_one["train/updates"] == 1.0
    for key in ("train/loss", "train/grad_norm", "train/pg_loss", "train/clip_frac", "train/advantage_std"):
        assert metrics_two[key] == pytest.approx(metrics_one[key], rel=1e-4, abs=1e-6), key


def test_a_rank_dead_during_a_sharded_export_is_reported_as_that_rank(ray_cluster, config):
    """FSDP2 (``--torchtrain-sharding fsdp``, the default) gathers each tensor from every rank when
    rank 0 exports, so with rank 1 dead, rank 0's export fails in the gather ('Connection reset by
    peer'); the driver-side export (``--weight-sync inprocess``) reports rank 1's death, one
    ProviderError naming it and --resume, not rank 0's gloo error."""
    from plasmid.errors import ProviderError

    sharded = copy.deepcopy(config)
    sharded.option.torchtrain_sharding = "fsdp"

    async def scenario():
        two = await start_trainers(sharded, Placement.unplaced(2, 0, Resources(0.5), Resources(0.5)))
        try:
            assert two.collective, "an FSDP2 trainer's export is collective"
            pids = [info["pid"] for info in two.infos]
            ray.kill(two.workers[1], no_restart=True)
            with pytest.raises(ProviderError) as raised:
                for _ in two.export_weights(1 << 30):
                    pass
            return pids, str(raised.value)
        finally:
            await two.shutdown()

    pids, message = asyncio.run(scenario())
    assert f"trainer worker rank 1 of 2 (pid {pids[1]})" in message and "export_weights" in message, message
    assert "--resume" in message and "\n" not in message, message
