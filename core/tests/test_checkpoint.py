"""Checkpoints are atomic: a failure while saving never leaves one that resume would pick."""

import asyncio
import json

import pytest

from plasmid.checkpoint import Checkpoints


class FakeTrainerState:
    """Test support: a trainer stand-in that writes one file, or fails mid-save."""

    def __init__(self, fail=False):
        self.fail = fail
        self.loaded = None

    async def save(self, path):
        from pathlib import Path

        Path(path).mkdir(parents=True)
        (Path(path) / "weights.txt").write_text("w")
        if self.fail:
            raise OSError("disk full")

    async def load(self, path):
        self.loaded = path


class Source:
    def __init__(self, position=0):
        self.position = position

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_latest_complete_checkpoint_is_found_and_restored(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=2)
    for step in (4, 9):
        state = Source(step * 10).state_dict()
        asyncio.run(checkpoints.save(step, FakeTrainerState(), state, {"weight_version": step + 1}))
    latest = checkpoints.latest()
    assert latest.name == "step_000009"
    trainer, source = FakeTrainerState(), Source()
    meta = asyncio.run(checkpoints.restore(latest, trainer, source))
    assert meta["rollout_id"] == 9 and meta["weight_version"] == 10
    assert source.position == 90 and trainer.loaded.endswith("step_000009/trainer")


def test_a_failed_save_leaves_the_previous_checkpoint_as_latest(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    asyncio.run(checkpoints.save(1, FakeTrainerState(), Source().state_dict(), {}))
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(checkpoints.save(2, FakeTrainerState(fail=True), Source().state_dict(), {}))
    assert checkpoints.latest().name == "step_000001"
    asyncio.run(checkpoints.save(3, FakeTrainerState(), Source().state_dict(), {}))
    assert not list((tmp_path / "checkpoints").glob("*.partial")), "the stale partial checkpoint was not removed"


def test_only_the_newest_are_kept(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=2)
    for step in range(5):
        asyncio.run(checkpoints.save(step, FakeTrainerState(), Source().state_dict(), {}))
    assert [p.name for p in checkpoints.complete()] == ["step_000003", "step_000004"]
    assert json.loads((checkpoints.latest() / "data_source.json").read_text()) == {"position": 0}
