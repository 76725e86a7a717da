"""``plasmid train --runtime ray --trainer megatron`` with two trainer workers that form one
tensor-parallel model (TP=2, each worker a rank of megatron's world): every call reaches both
ranks (the trainer is *collective*), weight syncs export on both ranks and deliver whole
tensors, and the engine's log-probs equal the trainer's after each sync.

The workers load ``cpu_shim_plugin.py`` (test support) from the plugin lock, so megatron-core
runs on CPU inside the Ray actors too.
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("plasmid_ray")

from test_megatron_e2e import SHIM_PLUGIN

from plasmid.app.run import run_training


@pytest.fixture(scope="module")
def ray_cluster():
    from plasmid_ray.testing import local_cluster

    with local_cluster(4) as ray:
        yield ray


@pytest.mark.parametrize("sync", ["objectstore", "broadcast"])
def test_tensor_parallel_trainer_workers_train_and_sync(ray_cluster, tmp_path, sync):
    run_dir = tmp_path / "run"
    asyncio.run(run_training([
        "--runtime", "ray", "--trainer", "megatron", "--plugins", str(SHIM_PLUGIN), "--trainer-workers", "2",
        "--tensor-model-parallel-size", "2", "--engines", "1", "--placement", "disaggregate", "--weight-sync", sync,
        "--num-rollouts", "3", "--prompts-per-step", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "8",
        "--eval-interval", "0", "--save-interval", "3", "--run-dir", str(run_dir)]))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["weight_version"] for m in metrics] == [1.0, 2.0, 3.0]
    assert all(m["train/updates"] == 1.0 and m["sync/bytes"] > 0 for m in metrics)
    # the engine samples with the weights the trainer synced: rollout and trainer log-probs agree
    assert max(m["train/train_rollout_logprob_abs_diff"] for m in metrics) <= 1e-4
    checkpoint = next((run_dir / "checkpoints").iterdir()) / "trainer"
    assert (checkpoint / "model" / "model.safetensors").is_file()
    assert (checkpoint / "dist" / "metadata.json").is_file()
    assert sorted(p.name for p in (checkpoint / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
