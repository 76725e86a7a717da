"""Parallel layouts on CPU, two processes over gloo: tensor, pipeline and data parallelism (with and
without the distributed optimizer) give the log-probs, losses, gradient norms and updated weights
of a single process on the same batches (the way slime checks its layouts).

Each layout runs ``parallel_worker.py`` in 2 fresh processes (seconds each: megatron's import
dominates). Updates use SGD so that equal weights mean equal gradients, parameter by parameter.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plasmid.tiny import build_tiny_model

WORKER = Path(__file__).resolve().parent / "parallel_worker.py"
COMPARED = ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm", "train/clip_frac", "train/approx_kl")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_layout(model_dir: Path, out: Path, world_size: int, **settings) -> dict:
    out.mkdir(parents=True)
    payload = json.dumps({"model": str(model_dir), "out": str(out), **settings})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    if world_size > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
    processes = [subprocess.Popen([sys.executable, str(WORKER), payload], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)} if world_size > 1 else env)
                 for rank in range(world_size)]
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank} of {settings} failed:\n{output[-4000:]}"
    return json.loads((out / "result.json").read_text())


def checkpoint_weights(out: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(out / "ckpt" / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("parallel") / "tiny", num_kv_heads=2)


@pytest.fixture(scope="module")
def single(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("layout") / "single"
    return run_layout(model_dir, out, 1), checkpoint_weights(out)


LAYOUTS = {
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
    "dp2": {},
}
#: megatron's distributed optimizer supports only Adam
ADAM = {"megatron_optimizer": "adam", "lr": 1e-3}
DISTRIBUTED_ADAM = {**ADAM, "megatron_use_distributed_optimizer": True}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layout_matches_a_single_process(layout, model_dir, single, tmp_path):
    expected, expected_weights = single
    got = run_layout(model_dir, tmp_path / layout, 2, options=LAYOUTS[layout])
    # vocabulary-parallel log-probs (TP=2 pads the vocabulary to 256 rows instead of 128)
    for values, reference in zip(got["logprobs"], expected["logprobs"], strict=True):
        assert np.allclose(values, reference, atol=1e-5, rtol=0)
    for step in ("first", "second"):
        for name in COMPARED:
            assert got[step][name] == pytest.approx(expected[step][name], rel=1e-4, abs=1e-6), (step, name)
    assert got["exported_names"] == expected["exported_names"]
    weights = checkpoint_weights(tmp_path / layout)
    assert set(weights) == set(expected_weights)
    for name, value in expected_weights.items():
        assert np.allclose(weights[name], value, atol=1e-6, rtol=0), name


def test_distributed_optimizer_matches_the_replicated_one(model_dir, tmp_path):
    """Adam with optimizer state sharded over the two data-parallel ranks, against Adam replicated
    on both (a sum of two gradients is the same whichever collective adds them)."""
    replicated = run_layout(model_dir, tmp_path / "replicated", 2, options=ADAM)
    sharded = run_layout(model_dir, tmp_path / "sharded", 2, options=DISTRIBUTED_ADAM)
    for step in ("first", "second"):
        for name in COMPARED:
            assert sharded[step][name] == pytest.approx(replicated[step][name], rel=1e-6, abs=1e-7), (step, name)
    expected_weights = checkpoint_weights(tmp_path / "replicated")
    weights = checkpoint_weights(tmp_path / "sharded")
    for name, value in expected_weights.items():
        assert np.allclose(weights[name], value, atol=1e-7, rtol=0), name


@pytest.mark.parametrize("layout", ["tp2", "dp2-distributed-adam"])
def test_layout_resumes_exactly_from_its_checkpoint(layout, model_dir, tmp_path):
    options = DISTRIBUTED_ADAM if layout == "dp2-distributed-adam" else LAYOUTS[layout]
    got = run_layout(model_dir, tmp_path / layout, 2, options=options, resume=True)
    assert got["resumed_weights_equal"]
    assert got["third_resumed"]["train/loss"] == got["third"]["train/loss"]
