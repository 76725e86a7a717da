"""Parallel layouts on CPU, two processes over gloo: tensor, pipeline and data parallelism (with and
without the distributed optimizer) give the log-probs, losses, gradient norms and updated weights
of a single process on the same batches (the way slime checks its layouts).

Each layout runs ``parallel_worker.py`` in 2 fresh processes (seconds each: megatron's import
dominates). Updates use SGD so that equal weights mean equal gradients, parameter by parameter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from multiprocess import run_ranks

WORKER = Path(__file__).resolve().parent / "parallel_worker.py"
COMPARED = ("train/loss", "train/pg_loss", "train/entropy", "train/grad_norm", "train/clip_frac", "train/approx_kl")


def run_layout(model_dir: Path, out: Path, world_size: int, **settings) -> dict:
    """``parallel_worker.py`` as ``world_size`` ranks on ``model_dir``; rank 0's result."""
    out.mkdir(parents=True)
    return run_ranks(WORKER, {"model": str(model_dir), "out": str(out), **settings}, world_size)


def checkpoint_weights(out: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(out / "ckpt" / "model" / "model.safetensors"))


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


#: layouts whose checkpoint is resumed: in the same layout, and in a single process. Adam, so that
#: its moments (split over tensor-parallel ranks, or over data-parallel ranks by the distributed
#: optimizer) must be resharded too.
RESUMED = {"tp2": {**ADAM, "tensor_model_parallel_size": 2}, "dp2-distributed-adam": DISTRIBUTED_ADAM}


@pytest.fixture(scope="module")
def resumed_run(model_dir, tmp_path_factory):
    """``resumed_run(layout) -> (out, result)``: the 2-process run of ``RESUMED[layout]`` that
    checkpoints after two steps and makes a third on the trainer that wrote the checkpoint and on
    a fresh one that loads it (run once per module, shared by the tests below)."""
    runs: dict[str, tuple[Path, dict]] = {}

    def run(layout: str) -> tuple[Path, dict]:
        if layout not in runs:
            out = tmp_path_factory.mktemp("resumed") / layout
            runs[layout] = out, run_layout(model_dir, out, 2, options=RESUMED[layout], resume=True)
        return runs[layout]

    return run


@pytest.mark.parametrize("layout", sorted(RESUMED))
def test_layout_resumes_exactly_from_its_checkpoint(layout, resumed_run):
    _, got = resumed_run(layout)
    assert got["resumed_weights_equal"]
    assert got["third_resumed"]["train/loss"] == got["third"]["train/loss"]


@pytest.mark.parametrize("layout", sorted(RESUMED))
def test_a_checkpoint_resumes_in_a_single_process(layout, model_dir, resumed_run, tmp_path):
    """Resharded into one process (TP=2 -> 1; DP=2 -> 1 with the distributed optimizer), the third
    step equals the one the 2-process trainer made after writing the checkpoint: same loss, same
    weights after the update, so Adam's moments and step count carried over. The same step from
    the checkpoint's weights alone (a new Adam) lands elsewhere, so the comparison can fail."""
    written, expected = resumed_run(layout)
    options = {name: value for name, value in RESUMED[layout].items() if name != "tensor_model_parallel_size"}
    got = run_layout(model_dir, tmp_path / "single", 1, options=options, resume_from=str(written / "ckpt"),
                     fresh_optimizer=True)
    assert got["counters"] == [2, 2]
    for name in COMPARED:
        assert got["third"][name] == pytest.approx(expected["third"][name], rel=1e-5, abs=1e-6), name
    from safetensors.numpy import load_file

    continued = load_file(str(written / "third.safetensors"))
    resumed = load_file(str(tmp_path / "single" / "third.safetensors"))
    fresh = load_file(str(tmp_path / "single" / "third_fresh.safetensors"))
    assert set(resumed) == set(continued)
    for name, value in continued.items():
        assert np.allclose(resumed[name], value, atol=2e-6, rtol=0), name
    assert max(float(np.abs(fresh[name] - value).max()) for name, value in continued.items()) > 1e-4
