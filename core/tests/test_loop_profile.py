"""``--profile``: the loop's per-step time breakdown (:class:`plasmid.loop.StepClock`) and the reward
set's busy time, with fake providers in this process; ``--profile-step`` outside the run is one error."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from plasmid import hookimpl, loop
from plasmid.app.cli import main
from plasmid.app.runlog import RunLog
from plasmid.registry import Registry
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.session import Session
from plasmid.startup import Startup
from plasmid.testing import make_config, make_manager
from plasmid.types import Group, RolloutBatch, Sample, SyncReport

PARTS = ("time/rollout_seconds", "time/train_seconds", "time/sync_wall_seconds", "time/eval_seconds",
         "time/checkpoint_seconds", "time/overhead_seconds")


class SlowTrainer:
    def __init__(self, config, loss=None):
        self.steps = 0

    async def train_step(self, batch):
        self.steps += 1
        time.sleep(0.03)
        return {"train/loss": 0.5}

    async def save(self, path):
        time.sleep(0.02)
        Path(path).mkdir(parents=True)
        (Path(path) / "state.json").write_text(json.dumps({"steps": self.steps}))

    async def load(self, path):
        self.steps = json.loads((Path(path) / "state.json").read_text())["steps"]


class SlowDriver:
    async def run(self, ctx, rollout_id):
        await asyncio.sleep(0.02)
        return RolloutBatch(rollout_id, [Group([Sample(reward=1.0)])], {"rollout/reward_mean": 1.0})

    async def evaluate(self, ctx, groups, params):
        await asyncio.sleep(0.01)
        return {"eval/accuracy": 0.5}


class SlowSync:
    async def sync(self, trainer, engines, version):
        return SyncReport(bytes=0, seconds=0.01, weight_version=version)


class Data:
    def eval_groups(self):
        return [Group([Sample()])]

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class Plugin:
    @hookimpl
    def plasmid_trainers(self, register):
        register("slow-trainer", SlowTrainer)


def run_loop(run_dir: Path, **options) -> list[dict]:
    plugin = Plugin()
    config = make_config(plugin, run_dir=run_dir, trainer="slow-trainer",
                         **{"num_rollouts": 4, "eval_interval": 2, "save_interval": 1, **options})
    manager = make_manager(plugin)
    startup = Startup(config, manager, Registry.collect(manager))
    ctx = SimpleNamespace(data_source=Data(), engines=[], eval_sampling=lambda: None)
    session = Session(startup=startup, ctx=ctx, driver=SlowDriver(), trainer=SlowTrainer(config),
                      weight_sync=SlowSync())
    run_dir.mkdir(parents=True)
    asyncio.run(loop.train(session, RunLog(run_dir, 4, stream=io.StringIO())))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_profile_breaks_each_step_down_into_parts_that_sum_to_its_wall_time(tmp_path):
    rows = run_loop(tmp_path / "run", profile=True)
    assert len(rows) == 4
    for row in rows:
        assert all(row[name] >= 0 for name in PARTS), row
        assert sum(row[name] for name in PARTS) == pytest.approx(row["time/step_seconds"], rel=1e-9, abs=1e-9)
        assert row["time/train_seconds"] >= 0.03 and row["time/rollout_seconds"] >= 0.02
        assert row["time/reward_seconds"] == 0.0     # no reward set in this session
    assert rows[0]["time/checkpoint_seconds"] == 0.0
    assert all(row["time/checkpoint_seconds"] >= 0.02 for row in rows[1:]), "the previous step's save is not counted"
    assert rows[1]["time/eval_seconds"] >= 0.01 and rows[0]["time/eval_seconds"] < rows[1]["time/eval_seconds"]


def test_without_profile_the_breakdown_is_absent(tmp_path):
    rows = run_loop(tmp_path / "run")
    assert "time/step_seconds" not in rows[0] and "time/overhead_seconds" not in rows[0]
    assert "time/train_seconds" in rows[0]


def test_reward_busy_time_counts_groups_scored_at_once_once(tmp_path):
    async def slow(sample):
        await asyncio.sleep(0.2)
        return 1.0

    rewards = RewardSet([RewardComponent("slow", 1.0, slow)])

    async def score():
        await asyncio.gather(*(rewards.score_group([Sample(), Sample()]) for _ in range(4)))

    try:
        asyncio.run(score())
        busy = rewards.pop_busy_seconds()
        assert 0.2 <= busy < 0.8, busy   # four groups of 0.2 s each, scored at the same time
        assert rewards.pop_busy_seconds() < 0.05    # popped: counting starts again
        asyncio.run(rewards.score_group([Sample()]))
        assert rewards.pop_busy_seconds() >= 0.2
    finally:
        rewards.close()


@pytest.mark.parametrize("value, expected", [
    ("3", "--profile-step 3: the run makes steps 0-2 (--num-rollouts 3)"),
    ("-1", "--profile-step"),
    ("x", "--profile-step"),
])
def test_a_profile_step_outside_the_run_is_one_error_line(tmp_path, capsys, value, expected):
    # the check runs once the selected plugins are known: it needs an installed data source (the
    # kernel-only tox env has none and says so first)
    pytest.importorskip("plasmid_tasks", reason="no data source installed (the kernel-only env)")
    (tmp_path / "none.py").write_text("")      # the kernel alone
    code = main(["train", "--plugins", str(tmp_path / "none.py"), "--num-rollouts", "3", "--profile-step", value,
                 "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()
