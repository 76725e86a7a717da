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
        "--save-interval", "2", "--eval-interval", "0", "--prompts-per-step", "4", "--n-samples-per-prompt", "4",
        "--ray-step-snapshot", "on"]  # auto may judge two FSDP ranks' snapshots too costly on 2 cores


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


#: metrics comparing the engine's log-probs with the trainer's: the engine batches requests as they
#: arrive, so its float rounding (1e-8 here) differs from run to run; the loss does not use them
ENGINE_NOISE = ("train/logprob_abs_diff_mean", "train/mismatch_", "train/train_rollout_logprob_abs_diff")


def learning(entry: dict[str, float]) -> dict[str, float]:
    """What a step learned and trained on (not its timings, the run's counters or the engine's
    rounding, :data:`ENGINE_NOISE`)."""
    return {k: v for k, v in entry.items()
            if k.startswith(("train/", "rollout/reward", "rollout/response")) and not k.endswith("seconds")
            and not k.startswith(ENGINE_NOISE)}


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


class RecordingWorker:
    """Test support: a trainer worker's surface (the methods the proxy sends in a step and a sync)
    that records each call with whether a snapshot was being taken on it when the call began.
    ``call`` runs ``fn(self, *args)``, which returns what a real worker's ``call`` does:
    ``(result, weights read whole since the step)``."""

    def __init__(self, snapshot_seconds: float = 0.5) -> None:
        self.log: list[tuple[str, bool]] = []
        self.snapshotting = False
        self.snapshot_seconds = snapshot_seconds

    async def train_step(self, batch):
        self.log.append(("train_step", self.snapshotting))
        return {"train/loss": 0.0}

    async def logprobs(self, samples, temperature):
        self.log.append(("logprobs", self.snapshotting))
        return [[0.0]]

    async def snapshot(self, base, token, read):
        self.log.append(("snapshot", self.snapshotting))
        self.snapshotting = True
        await asyncio.sleep(self.snapshot_seconds)  # a collective save: long enough for a careless driver to send more
        self.snapshotting = False
        return {"state.pt": b"x"} if read else {}, (1 if read else 0, self.snapshot_seconds)

    async def call(self, fn, args):
        self.log.append((fn.__name__, self.snapshotting))
        return fn(self, *args)

    async def recorded(self):
        return self.log


def recording_workers(count, snapshot_seconds=0.5):
    return [ray.remote(num_cpus=0)(RecordingWorker).remote(snapshot_seconds) for _ in range(count)]


def recording_infos(tmp_path):
    return [{"collective": True, "snapshot_base": str(tmp_path), "pid": 0}] * 2


def export_begun(worker):
    return None, False  # an export is open (a sync reads it one bucket per call)


def export_ended(worker):
    return None, True  # the last bucket was read: the weights were read whole


def after_export(worker):
    return "closed", True


def test_the_proxy_never_sends_a_call_beside_a_snapshot_being_taken(ray_cluster, tmp_path):
    """Ray runs an async actor's tasks in no set order, so a snapshot (a collective save) sent
    beside an export's calls could meet them on another rank: CI's colocate quickstart deadlocked
    that way (rank 0 exporting, rank 1 saving). The snapshot starts once the export has ended, and
    every later call waits for it."""
    from types import SimpleNamespace

    workers = recording_workers(2)
    proxy = TrainerProxy(workers, recording_infos(tmp_path), step_snapshot="on")

    async def step_and_sync(step):
        await proxy.train_step(SimpleNamespace(rollout_id=step))
        assert await proxy.plasmid_call(export_begun) is None
        assert proxy.pending is None, "no snapshot while the export is open"
        await proxy.plasmid_call(export_ended)
        assert proxy.pending is not None and proxy.pending.step == step, "the snapshot starts once the export ended"
        assert await proxy.plasmid_call(after_export) == "closed"  # waits for the snapshot, then is sent
        assert await proxy.logprobs([], 1.0) == [[0.0]]

    async def main():
        await step_and_sync(0)
        await step_and_sync(1)
        await proxy.train_step(SimpleNamespace(rollout_id=2))  # no sync: step 1's snapshot is whole before it
        await proxy.train_step(SimpleNamespace(rollout_id=3))  # step 2's starts right before step 3 and is awaited
        return [await worker.recorded.remote() for worker in workers]

    logs = asyncio.run(main())
    for rank, log in enumerate(logs):
        beside = [name for name, snapshotting in log if snapshotting]
        assert not beside, f"rank {rank} got {beside} while a snapshot was being taken: {log}"
    assert [name for name, _ in logs[0]] == [
        "train_step", "export_begun", "export_ended", "snapshot", "after_export", "logprobs",
        "train_step", "export_begun", "export_ended", "snapshot", "after_export", "logprobs",
        "train_step", "snapshot", "train_step"]
    assert proxy.snapshot is not None and proxy.snapshot.step == 2


def test_auto_turns_snapshots_off_when_one_takes_over_a_tenth_of_a_step(ray_cluster, tmp_path, capfd):
    """A snapshot of two FSDP ranks on this machine's two cores makes a 390 ms step ~90 ms slower
    even behind the rollout; ``auto`` judges a snapshot's duration against the step once, after
    the first steps, and says so in one line when it turns snapshots off."""
    from types import SimpleNamespace

    from plasmid_ray.snapshots import AUTO_SAMPLES, AUTO_WARMUP

    slow = TrainerProxy(recording_workers(2, 0.3), recording_infos(tmp_path), step_snapshot="auto")
    cheap = TrainerProxy(recording_workers(2, 0.0), recording_infos(tmp_path), step_snapshot="auto")

    async def run(proxy):
        for step in range(AUTO_WARMUP + AUTO_SAMPLES + 2):
            await proxy.train_step(SimpleNamespace(rollout_id=step))
            await asyncio.sleep(0.3)  # the rollout and sync between steps

    asyncio.run(run(slow))
    err = capfd.readouterr().err
    assert slow.step_snapshot == "off" and slow.snapshot is None and slow.pending is None
    assert "--ray-step-snapshot auto: off, a snapshot takes" in err, err
    assert "--ray-step-snapshot on keeps it" in err and err.count("\n") == 1, err

    asyncio.run(run(cheap))
    assert cheap.step_snapshot == "auto" and "auto: off" not in capfd.readouterr().err
    assert cheap.snapshot is not None and cheap.snapshot.step == AUTO_WARMUP + AUTO_SAMPLES, "the last step but one"
