"""The loop under faults, with fake providers in this process: steps the trainer refuses
(``--max-bad-steps``), steps whose every group the filters drop (``--max-empty-steps``), and
SIGTERM / SIGINT during a step (a checkpoint of the finished step, then a normal return; a
second SIGINT stops at once)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from plasmid import hookimpl, loop
from plasmid.app.runlog import RunLog
from plasmid.errors import RunStopped
from plasmid.protocols import BAD_STEP_PREFIX
from plasmid.registry import Registry
from plasmid.session import Session
from plasmid.startup import Startup
from plasmid.testing import make_config, make_manager
from plasmid.types import Group, RolloutBatch, Sample, SyncReport


class FakeTrainer:
    """Refuses the steps in ``bad`` (with ``reasons``); runs ``on_step[step]()`` inside a step."""

    def __init__(self, config, loss=None):
        self.bad: set[int] = set()
        self.reasons = ("nonfinite_grad_norm",)
        self.on_step: dict[int, object] = {}
        self.steps = 0

    async def train_step(self, batch):
        step, self.steps = self.steps, self.steps + 1
        if step in self.on_step:
            self.on_step[step]()
        if step in self.bad:
            return {BAD_STEP_PREFIX + reason: 1.0 for reason in self.reasons}
        return {"train/loss": 0.5}

    async def save(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "state.json").write_text(json.dumps({"steps": self.steps}))

    async def load(self, path):
        self.steps = json.loads((Path(path) / "state.json").read_text())["steps"]


class FakeDriver:
    """One group per step, or none (every group 'dropped by the filter') on the steps in ``empty``."""

    def __init__(self):
        self.empty: set[int] = set()

    async def run(self, ctx, rollout_id):
        if rollout_id in self.empty:
            return RolloutBatch(rollout_id, [], {"rollout/groups_kept": 0.0, "rollout/dropped/zero_std": 4.0})
        return RolloutBatch(rollout_id, [Group([Sample(reward=1.0)])], {"rollout/reward_mean": 1.0})

    async def evaluate(self, ctx, groups, params):
        return {}


class FakeSync:
    async def sync(self, trainer, engines, version):
        return SyncReport(bytes=0, seconds=0.0, weight_version=version)


class FakeData:
    def eval_groups(self):
        return []

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class FakeTrainerPlugin:
    @hookimpl
    def plasmid_trainers(self, register):
        register("fake-trainer", FakeTrainer)

    @hookimpl
    def plasmid_filters(self, register):
        register("drop-all", lambda config: lambda group: None)


def make_session(run_dir, **options):
    plugin = FakeTrainerPlugin()
    options = {"num_rollouts": 10, "eval_interval": 0, "save_interval": 0, **options}
    config = make_config(plugin, run_dir=run_dir, trainer="fake-trainer", **options)
    manager = make_manager(plugin)
    startup = Startup(config, manager, Registry.collect(manager))
    ctx = SimpleNamespace(data_source=FakeData(), engines=[], eval_sampling=lambda: None)
    return Session(startup=startup, ctx=ctx, driver=FakeDriver(), trainer=FakeTrainer(config),
                   weight_sync=FakeSync())


def train(session):
    log = RunLog(session.config.run_dir, 10, stream=io.StringIO())
    session.config.run_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(loop.train(session, log))


def steps_logged(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def checkpoint_steps(run_dir):
    return sorted(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").iterdir())


def test_bad_steps_in_a_row_stop_the_run_with_a_checkpoint_naming_the_trainers_plugin(tmp_path, capsys):
    session = make_session(tmp_path / "run", max_bad_steps=3)
    session.trainer.bad = {1, 3, 4, 5, 6}
    with pytest.raises(RunStopped) as stopped:
        train(session)
    message = str(stopped.value)
    assert "stopped after 3 bad steps in a row (steps 3-5)" in message
    assert "trainer 'fake-trainer' from plugin 'FakeTrainerPlugin'" in message
    assert "nonfinite_grad_norm" in message and "--max-bad-steps" in message
    assert "\n" not in message
    assert steps_logged(tmp_path / "run") == [0, 1, 2, 3, 4, 5]
    assert checkpoint_steps(tmp_path / "run") == [5], "no checkpoint of the last step before stopping"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "refused the step" in line]
    assert len(warnings) == 4  # steps 1, 3, 4, 5, each named with the step and the reasons
    assert warnings[0].startswith("plasmid: warning: step 1: trainer 'fake-trainer' from plugin 'FakeTrainerPlugin'")
    assert "nonfinite_grad_norm [1 of --max-bad-steps 3 in a row]" in warnings[0]
    assert "[3 of --max-bad-steps 3 in a row]" in warnings[-1]


def test_steps_with_every_group_dropped_warn_and_stop_after_max_empty_steps_naming_the_filters(tmp_path, capsys):
    session = make_session(tmp_path / "run", max_empty_steps=2, filter=["drop-all"])
    session.driver.empty = {1, 3, 4}
    with pytest.raises(RunStopped) as stopped:
        train(session)
    message = str(stopped.value)
    assert "stopped after 2 steps in a row (steps 3-4) with no group left to train on" in message
    assert "the filters (drop-all; --filter)" in message and "--max-empty-steps" in message
    assert checkpoint_steps(tmp_path / "run") == [4]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "no group was left" in line]
    assert len(warnings) == 3
    assert "step 1:" in warnings[0] and "zero_std 4" in warnings[0] and "drop-all" in warnings[0]


def test_a_good_step_ends_a_streak(tmp_path):
    session = make_session(tmp_path / "run", max_bad_steps=2, max_empty_steps=2, num_rollouts=6)
    session.trainer.bad = {0, 2}  # trainer steps 0-3 are run steps 0, 2, 3, 5 (1 and 4 are empty)
    session.driver.empty = {1, 4}
    train(session)
    assert steps_logged(tmp_path / "run") == list(range(6))


def test_an_empty_step_does_not_end_a_bad_streak(tmp_path):
    session = make_session(tmp_path / "run", max_bad_steps=2)
    session.trainer.bad = {0, 1}  # run steps 0 and 2
    session.driver.empty = {1}
    with pytest.raises(RunStopped, match=r"2 bad steps in a row \(steps 0-2\)"):
        train(session)


def test_sigterm_during_a_step_finishes_it_checkpoints_and_returns(tmp_path, capsys):
    session = make_session(tmp_path / "run")
    session.trainer.on_step[2] = lambda: os.kill(os.getpid(), signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    train(session)
    assert steps_logged(tmp_path / "run") == [0, 1, 2]
    assert checkpoint_steps(tmp_path / "run") == [2]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before, "handlers not restored"
    err = capsys.readouterr().err
    assert "stopped by SIGTERM after step 2" in err

    resumed = make_session(tmp_path / "run", resume=True, num_rollouts=5)
    train(resumed)
    assert steps_logged(tmp_path / "run") == [0, 1, 2, 3, 4]


def test_a_second_sigint_stops_at_once_without_a_checkpoint(tmp_path):
    session = make_session(tmp_path / "run")

    def interrupt_twice():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    session.trainer.on_step[1] = interrupt_twice
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        train(session)
    assert steps_logged(tmp_path / "run") == [0]
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert signal.getsignal(signal.SIGINT) == before


class CountingData(FakeData):
    """Hands out prompts by position: ``state_dict`` says how many groups were taken."""

    def __init__(self):
        self.taken = 0

    def take(self):
        self.taken += 1

    def state_dict(self):
        return {"taken": self.taken}

    def load_state_dict(self, state):
        self.taken = state["taken"]


class TakingDriver(FakeDriver):
    """Takes its prompts from the data source when the rollout starts, as real drivers do."""

    async def run(self, ctx, rollout_id):
        ctx.data_source.take()
        await asyncio.sleep(0)
        return await super().run(ctx, rollout_id)


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_a_checkpoint_holds_the_data_position_of_its_own_step_or_the_rollout_in_flight(tmp_path, schedule):
    """With ``--schedule async`` step k+1's rollout has taken its prompts when step k is saved: the
    checkpoint holds that rollout, finished (``in_flight.json``), and the data position after it, so
    a resume trains on those very samples (not ones generated again with newer weights) and skips
    no prompts. Without a rollout in flight it holds "k+1 groups taken" and nothing else."""
    session = make_session(tmp_path / "run", schedule=schedule, placement="disaggregate", save_interval=2,
                           num_rollouts=4)
    session.ctx.data_source, session.driver = CountingData(), TakingDriver()
    train(session)
    for step in (1, 3):
        checkpoint = tmp_path / "run" / "checkpoints" / f"step_{step:06d}"
        in_flight = schedule == "async" and step < 3           # the last step starts no next rollout
        assert json.loads((checkpoint / "data_source.json").read_text()) == {"taken": step + 1 + in_flight}
        assert (checkpoint / "in_flight.json").is_file() == in_flight
        if in_flight:
            assert json.loads((checkpoint / "in_flight.json").read_text())["rollout_id"] == step + 1


class FailingDriver(FakeDriver):
    """A rollout-side provider (reward, engine) fails in step ``fail_at``'s rollout."""

    fail_at = 3

    async def run(self, ctx, rollout_id):
        if rollout_id == self.fail_at:
            raise RuntimeError("engine exploded")
        return await super().run(ctx, rollout_id)


def test_a_failing_rollout_checkpoints_the_last_finished_step_before_the_error_propagates(tmp_path, capsys):
    session = make_session(tmp_path / "run", save_interval=0)
    session.driver = FailingDriver()
    with pytest.raises(RuntimeError, match="engine exploded"):
        train(session)
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step_000002"]
    assert json.loads((tmp_path / "run" / "checkpoints" / "step_000002" / "trainer" / "state.json").read_text()) == {
        "steps": 3}
    assert "of step 2 written before stopping on the error below" in capsys.readouterr().err


class StuckSync(FakeSync):
    """The weight sync of step ``fail_at`` raises as a phase past its deadline does."""

    fail_at = 2

    async def sync(self, trainer, engines, version):
        if version == self.fail_at + 1:
            raise TimeoutError("weight sync 'fake': phase 'load' of engine 0 (X, rank 1) did not finish within 1 s")
        return await super().sync(trainer, engines, version)


def test_a_failing_sync_checkpoints_the_step_it_trained_before_the_error_propagates(tmp_path, capsys):
    session = make_session(tmp_path / "run", save_interval=0)
    session.weight_sync = StuckSync()
    with pytest.raises(TimeoutError, match="phase 'load' of engine 0"):
        train(session)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert checkpoint_steps(tmp_path / "run") == [2]
    assert json.loads((checkpoint / "trainer" / "state.json").read_text()) == {"steps": 3}
    assert "of step 2 written before stopping on the error below" in capsys.readouterr().err


class RecordingDriver(TakingDriver):
    """Records the rollouts it runs; each step's one sample carries its step as its reward."""

    def __init__(self):
        super().__init__()
        self.ran: list[int] = []

    async def run(self, ctx, rollout_id):
        self.ran.append(rollout_id)
        ctx.data_source.take()
        return RolloutBatch(rollout_id, [Group([Sample(reward=float(rollout_id))])], {"rollout/reward_mean": 1.0})


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_a_failing_train_step_checkpoints_the_last_finished_step_with_its_batch_to_train_on_resume(
        tmp_path, capsys, schedule):
    """Step 3's train step fails (a trainer worker died): step 2 is checkpointed (even though its
    save-interval checkpoint exists) with step 3's batch as ``in_flight`` and the data position
    after it, and a ``--resume`` trains step 3 on that batch instead of rolling it out again."""
    session = make_session(tmp_path / "run", save_interval=3, num_rollouts=5, schedule=schedule,
                           placement="disaggregate")
    session.ctx.data_source, session.driver = CountingData(), RecordingDriver()
    session.trainer.saves_finished_step = True  # as the Ray runtime's proxy, with its step snapshot

    def die():
        raise RuntimeError("trainer worker rank 0 died during train_step")

    session.trainer.on_step[3] = die
    with pytest.raises(RuntimeError, match="died during train_step"):
        train(session)
    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    assert checkpoint_steps(tmp_path / "run") == [2]
    assert json.loads((checkpoint / "in_flight.json").read_text())["rollout_id"] == 3
    assert json.loads((checkpoint / "data_source.json").read_text()) == {"taken": 4}
    assert "of step 2 written before stopping on the error below" in capsys.readouterr().err

    resumed = make_session(tmp_path / "run", save_interval=3, num_rollouts=5, schedule=schedule,
                           placement="disaggregate", resume=True)
    resumed.ctx.data_source, resumed.driver = CountingData(), RecordingDriver()
    trained: list[float] = []
    step = resumed.trainer.train_step

    async def recording(batch):
        trained.append(batch.groups[0].samples[0].reward)
        return await step(batch)

    resumed.trainer.train_step = recording
    train(resumed)
    assert trained == [3.0, 4.0] and resumed.driver.ran == [4], "step 3 trains the saved batch"
    assert resumed.ctx.data_source.taken == 5


def test_a_trainer_that_cannot_vouch_for_its_state_after_a_failed_step_is_not_checkpointed_then(tmp_path, capsys):
    """A trainer without ``saves_finished_step`` may be half-updated after a failed step: nothing is
    saved (the save-interval checkpoint of step 2 stays as it was), so no checkpoint holds a torn state."""
    session = make_session(tmp_path / "run", save_interval=3, num_rollouts=5, placement="disaggregate")
    session.ctx.data_source, session.driver = CountingData(), RecordingDriver()
    saved = []
    real_save = session.trainer.save

    async def recording_save(path):
        saved.append(Path(path).parent.name)
        await real_save(path)

    session.trainer.save = recording_save

    def die():
        raise RuntimeError("the loss raised")

    session.trainer.on_step[3] = die
    with pytest.raises(RuntimeError, match="the loss raised"):
        train(session)
    assert checkpoint_steps(tmp_path / "run") == [2] and len(saved) == 1
    assert not (tmp_path / "run" / "checkpoints" / "step_000002" / "in_flight.json").exists()
    assert "written before stopping" not in capsys.readouterr().err


def test_a_rollout_failing_in_the_first_step_saves_nothing(tmp_path):
    session = make_session(tmp_path / "run", save_interval=0)
    session.driver = FailingDriver()
    session.driver.fail_at = 0
    with pytest.raises(RuntimeError):
        train(session)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_metrics_are_fsynced_before_each_checkpoint_is_written(tmp_path, fsync_events):
    """Steps' metrics lines are not fsynced one by one (plasmid.app.runlog); a checkpoint must never be
    on disk while the metrics of its steps might not be, so each save starts with an fsync."""
    events = fsync_events
    session = make_session(tmp_path / "run", num_rollouts=4, save_interval=2)
    real_save = session.trainer.save

    async def recording_save(path):
        events.append(f"save {Path(path).parent.name}")
        await real_save(path)

    session.trainer.save = recording_save
    train(session)
    saves = [index for index, event in enumerate(events) if event.startswith("save ")]
    assert len(saves) == 2, events                                 # after steps 1 and 3
    for save in saves:
        metrics_syncs = [i for i, event in enumerate(events[:save]) if event == "fsync metrics.jsonl"]
        earlier_save = max([i for i in saves if i < save], default=-1)
        assert metrics_syncs and metrics_syncs[-1] > earlier_save, events
    assert events.count("fsync metrics.jsonl") == 2, events        # not once per step
