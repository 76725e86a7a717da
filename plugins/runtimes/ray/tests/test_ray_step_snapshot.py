"""Step snapshots (:mod:`plasmid_ray.snapshots`): a trainer worker's death still leaves a
checkpoint of the last finished step, and ``--resume`` trains the next step exactly as an
uninterrupted run did.

Real runs of the tiny CPU quickstart (``--runtime ray``, 2 FSDP trainer workers, so a collective
trainer) in this test's process, on the module's local cluster. Rank 0 is SIGKILLed in the train
step of step ``KILLED``: it is first frozen (SIGSTOP) so that the step is sent to both ranks (rank
1 starts it and waits in a collective for rank 0), then killed. The trainer state of the last
finished step then lives only in the driver's snapshot, which must still be readable.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from contextlib import contextmanager

import pytest

ray = pytest.importorskip("ray")

from plasmid_ray.snapshots import read_tree, write_tree  # noqa: E402
from plasmid_ray.trainer import TrainerProxy  # noqa: E402

from plasmid.app.run import run_training  # noqa: E402
from plasmid.errors import ProviderError  # noqa: E402

STEPS = 6
#: the step whose train step rank 0 dies in (with snapshots); the run without dies in STEPS - 1
KILLED = 3
ARGS = ["--runtime", "ray", "--engines", "1", "--trainer-workers", "2", "--num-rollouts", str(STEPS),
        "--save-interval", "2", "--eval-interval", "0", "--prompts-per-step", "4", "--n-samples-per-prompt", "4"]


@contextmanager
def rank0_killed_in_step(step: int):
    """While active, rank 0 of the run's trainer is SIGKILLed in the train step of ``step``."""
    original = TrainerProxy.train_step

    async def train_step(self, batch):
        if batch.rollout_id != step:
            return await original(self, batch)
        await self._settle()  # the last finished step's snapshot is whole before the kill
        pid = self.infos[0]["pid"]
        os.kill(pid, signal.SIGSTOP)
        stepping = asyncio.ensure_future(original(self, batch))
        await asyncio.sleep(1.0)  # both ranks have the step; rank 1 is in it, waiting for rank 0
        os.kill(pid, signal.SIGKILL)
        return await stepping

    TrainerProxy.train_step = train_step
    try:
        yield
    finally:
        TrainerProxy.train_step = original


def train(run_dir, *extra: str):
    asyncio.run(run_training([*ARGS, "--run-dir", str(run_dir), *extra]))


def killed_run(run_dir, step: int, *extra: str) -> ProviderError:
    with rank0_killed_in_step(step), pytest.raises(ProviderError) as failure:
        train(run_dir, *extra)
    return failure.value


def logged(run_dir) -> dict[int, dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {entry["step"]: entry for entry in map(json.loads, filter(None, lines))}


def learning(entry: dict[str, float]) -> dict[str, float]:
    """What a step learned and trained on (not its timings or the run's counters)."""
    return {k: v for k, v in entry.items()
            if k.startswith(("train/", "rollout/reward", "rollout/response")) and not k.endswith("seconds")}


def complete(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if (p / "meta.json").is_file())


def test_a_snapshot_writes_back_the_layout_it_read(tmp_path):
    saved = tmp_path / "saved"
    (saved / "model").mkdir(parents=True)
    (saved / "empty" / "dir").mkdir(parents=True)
    (saved / "model" / "weights.safetensors").write_bytes(bytes(range(256)) * 3)
    (saved / "state.pt").write_bytes(b"")
    files = read_tree(saved)
    assert files == {"model/weights.safetensors": bytes(range(256)) * 3, "state.pt": b"", "empty/dir/": b""}
    assert write_tree(files, tmp_path / "copy" / "trainer") == 768
    assert read_tree(tmp_path / "copy" / "trainer") == files
    with pytest.raises(ValueError, match="leaves the checkpoint directory"):
        write_tree({"../outside": b"x"}, tmp_path / "copy" / "trainer")
    assert not (tmp_path / "copy" / "outside").exists()


@pytest.mark.timeout(900)
def test_a_dead_rank_0_leaves_the_last_finished_step_and_resume_trains_the_next_as_an_uninterrupted_run(
        ray_cluster, tmp_path, capfd):
    # without snapshots (today's behaviour): the run dies in step STEPS - 1, after logging the steps the
    # other run is compared with, and only the save-interval checkpoint is left
    plain = tmp_path / "plain"
    started = time.perf_counter()
    error = str(killed_run(plain, STEPS - 1, "--ray-step-snapshot", "off"))
    plain_seconds = time.perf_counter() - started
    assert "\n" not in error and "trainer worker rank 0 of 2" in error and "died during train_step" in error, error
    assert (f"the trainer state of the last finished step ({STEPS - 2}) was lost with it (--ray-step-snapshot off)"
            in error), error
    assert f"the last complete checkpoint ({plain / 'checkpoints' / f'step_{STEPS - 3:06d}'})" in error, error
    assert complete(plain) == [f"step_{STEPS - 5:06d}", f"step_{STEPS - 3:06d}"]
    assert "driver-held snapshot" not in capfd.readouterr().err

    run = tmp_path / "run"
    started = time.perf_counter()
    error = str(killed_run(run, KILLED))
    snapshot_seconds = time.perf_counter() - started
    err = capfd.readouterr().err
    last = run / "checkpoints" / f"step_{KILLED - 1:06d}"
    assert "\n" not in error and "trainer worker rank 0 of 2" in error and "died during train_step" in error, error
    assert f"continue from step {KILLED - 1}'s checkpoint ({last})" in error, error
    assert f"the driver-held snapshot of step {KILLED - 1}" in err, err
    assert f"of step {KILLED - 1} written before stopping on the error below" in err, err
    # the save-interval checkpoint and the last finished step's, with the killed step's batch to train
    assert complete(run) == [f"step_{KILLED - 2:06d}", last.name]
    assert json.loads((last / "in_flight.json").read_text())["rollout_id"] == KILLED
    before = logged(run)
    assert sorted(before) == list(range(KILLED))
    for step in range(KILLED):  # the two runs are the same run until the kill
        assert learning(before[step]) == learning(logged(plain)[step]), f"step {step}"

    train(run, "--resume")
    after = logged(run)
    assert sorted(after) == list(range(STEPS))
    assert learning(after[KILLED]) == learning(logged(plain)[KILLED]), \
        "the resumed step trains the saved batch from the snapshot's state as the uninterrupted run did"
    assert {"train/loss", "train/entropy"} <= set(learning(after[KILLED])), "compared what it learned"
    with capfd.disabled():
        print(f"\n  ray step snapshot: killed runs without/with snapshots {plain_seconds:.0f}/{snapshot_seconds:.0f} s")
