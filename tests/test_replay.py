"""``--save-rollouts`` and ``plasmid replay``: the saved format round-trips, damage is one line,
and a replay of a saved run reproduces its training metrics bit for bit."""

from __future__ import annotations

import io
import json
import math

import pytest
from plasmid_e2e import read_metrics, run_plasmid

from plasmid import hookimpl
from plasmid.app.rollout_store import FORMAT_VERSION, RolloutStore, decode_step, encode_step, step_path
from plasmid.errors import PlasmidError, UsageError
from plasmid.types import Group, RolloutBatch, Sample, Status

SMALL = ["--seed", "3", "--num-rollouts", "3", "--prompts-per-step", "4", "--n-samples-per-prompt", "4",
         "--eval-interval", "0", "--save-interval", "0"]


def _batch() -> RolloutBatch:
    sample = Sample(prompt=[{"role": "user", "content": "2+2="}], tokens=[1, 2, 3, 4], response="4",
                    response_length=2, loss_mask=[1, 0], rollout_logprobs=[-0.1 / 3, math.nan], reward=0.1 + 0.2,
                    reward_components={"exact": 1.0}, label="4", metadata={"subset": "a", "n": (1, 2)},
                    status=Status.TRUNCATED, weight_version=2, index=5, group_index=1)
    return RolloutBatch(rollout_id=7, groups=[Group([sample], index=1)], metrics={"rollout/reward_mean": 1 / 3})


def test_a_step_round_trips_bit_for_bit(tmp_path):
    store = RolloutStore(tmp_path / "saved")
    store.check_writable()
    path = store.save(_batch())
    assert path == step_path(tmp_path / "saved", 7) and store.steps() == [7]
    header = json.loads(path.read_text().splitlines()[0])
    assert header["format"] == "plasmid-rollouts" and header["version"] == FORMAT_VERSION
    back = store.load(7)
    got, want = back.groups[0].samples[0], _batch().groups[0].samples[0]
    assert got.rollout_logprobs[0] == want.rollout_logprobs[0] and math.isnan(got.rollout_logprobs[1])
    assert got.reward == want.reward and got.status is Status.TRUNCATED and got.metadata["n"] == [1, 2]
    assert (got.tokens, got.loss_mask, got.index, got.group_index) == ([1, 2, 3, 4], [1, 0], 5, 1)
    assert back.metrics == {"rollout/reward_mean": 1 / 3} and back.groups[0].index == 1


@pytest.mark.parametrize(("edit", "message"), [
    (lambda text: text.replace('"version": 1', '"version": 99'), "format version 99"),
    (lambda text: text.splitlines()[0] + "\n", "counts 1 groups but the file holds 0"),
    (lambda text: text.replace('"status": "truncated"', '"status": "odd"'), "unknown sample status"),
    (lambda text: text.replace('"group_index"', '"grp"'), "sample fields differ"),
    (lambda text: "{nope\n", "line 1: not JSON"),
])
def test_a_damaged_step_file_is_one_line_naming_it(tmp_path, edit, message):
    text = edit(encode_step(_batch()))
    with pytest.raises(PlasmidError, match=message) as caught:
        decode_step(text, "saved/step_000007.jsonl")
    assert "saved/step_000007.jsonl" in str(caught.value) and "\n" not in str(caught.value)


def test_replay_refuses_missing_steps_before_writing(tmp_path):
    store = RolloutStore(tmp_path)
    store.save(_batch())
    with pytest.raises(UsageError, match="lacks step 0 of the 3 to replay"):
        store.check_readable(0, 2)


@pytest.mark.timeout(600)
def test_replay_reproduces_the_saved_runs_losses_bit_for_bit(tmp_path):
    saved, first, again = tmp_path / "saved", tmp_path / "train", tmp_path / "replay"
    trained = run_plasmid("train", *SMALL, "--run-dir", str(first), "--save-rollouts", str(saved))
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert sorted(p.name for p in saved.iterdir()) == [f"step_00000{i}.jsonl" for i in range(3)]
    bad = run_plasmid("replay", str(saved), *SMALL[:2], "--num-rollouts", "4", "--run-dir", str(tmp_path / "x"))
    assert bad.returncode == 2 and "lacks step 3" in bad.stderr and not (tmp_path / "x").exists()
    replayed = run_plasmid("replay", str(saved), *SMALL, "--run-dir", str(again),
                           "--save-rollouts", str(tmp_path / "ignored"))  # the original's options are accepted
    assert replayed.returncode == 0, replayed.stderr[-2000:]
    assert "--save-rollouts is ignored" in replayed.stderr and not (tmp_path / "ignored").exists()
    want, got = read_metrics(first), read_metrics(again)
    assert [row["step"] for row in got] == [0, 1, 2]
    for a, b in zip(want, got, strict=True):
        train_keys = sorted(k for k in a if k.startswith("train/") and "seconds" not in k)
        assert "train/loss" in train_keys
        assert {k: a[k] for k in train_keys} == {k: b.get(k) for k in train_keys}, a["step"]
    assert any(row["train/loss"] != 0 for row in want) or any(row["train/grad_norm"] for row in want)


class _Observer:
    """A plugin object of observer hooks for :func:`plasmid.testing.make_manager`: each hook
    records its call in ``calls``, or raises when named in ``failing``."""

    def __init__(self, calls, failing=()):
        self.calls, self.failing = calls, failing

    def _hook(self, name, value):
        if name in self.failing:
            raise RuntimeError(f"{type(self).__name__} cannot {name}")
        self.calls.append((type(self).__name__, name, value))

    @hookimpl
    def plasmid_run_start(self, run_dir):
        self._hook("run_start", run_dir)

    @hookimpl
    def plasmid_run_end(self, metrics, error):
        self._hook("run_end", error)


class Tracker(_Observer):
    pass


class Logger(_Observer):
    pass


def test_a_failing_run_end_observer_is_one_warning_and_the_others_still_run(tmp_path):
    from plasmid.app.run import notify_run_end
    from plasmid.testing import make_config, make_manager

    calls = []
    manager = make_manager(Tracker(calls), Logger(calls, failing=("run_end",)))
    stream = io.StringIO()
    notify_run_end(manager, make_config(run_dir=tmp_path), {}, "boom", stream=stream)
    assert calls == [("Tracker", "run_end", "boom")]
    assert stream.getvalue() == "plasmid: warning: plugin 'Logger' failed in plasmid_run_end: RuntimeError: Logger " \
                                "cannot run_end\n"


def test_a_failing_run_start_observer_is_switched_off_or_with_fail_stops_the_start(tmp_path, capsys):
    from plasmid.app.run import notify_run_end, notify_run_start
    from plasmid.errors import PluginError
    from plasmid.testing import make_config, make_manager

    calls = []
    config = make_config(run_dir=tmp_path)
    manager = make_manager(Tracker(calls, failing=("run_start",)), Logger(calls))
    notify_run_start(manager, config)
    assert "plugin 'Tracker' (distribution (test) ) failed in plasmid_run_start: RuntimeError: Tracker cannot " \
           "run_start; its observer hooks are off for the rest of the run" in capsys.readouterr().err
    notify_run_end(manager, config, {}, None)
    assert calls == [("Logger", "run_start", str(tmp_path)), ("Logger", "run_end", None)]  # Tracker is off

    calls.clear()
    manager = make_manager(Tracker(calls, failing=("run_start",)), Logger(calls))
    manager.observer_errors = "fail"
    with pytest.raises(PluginError, match="plugin 'Tracker' .* failed in plasmid_run_start: RuntimeError: Tracker "
                                          "cannot run_start; what the start-up wrote is removed"):
        notify_run_start(manager, config)
    assert calls == [("Logger", "run_start", str(tmp_path))]  # every other run-start observer was called


def test_announce_with_a_failing_run_start_tells_the_run_end_observers_and_shuts_the_session_down(tmp_path):
    import asyncio
    from types import SimpleNamespace

    from plasmid.app.run import announce
    from plasmid.errors import PluginError
    from plasmid.testing import make_config, make_manager

    calls, shut = [], []
    manager = make_manager(Tracker(calls, failing=("run_start",)), Logger(calls))
    manager.observer_errors = "fail"

    async def shutdown():
        shut.append(True)

    session = SimpleNamespace(startup=SimpleNamespace(manager=manager), config=make_config(run_dir=tmp_path),
                              shutdown=shutdown)
    with pytest.raises(PluginError, match="failed in plasmid_run_start"):
        asyncio.run(announce(session))
    assert shut == [True]
    [(_, _, error)] = [call for call in calls if call[1] == "run_end"]
    assert error.startswith("plugin 'Tracker' (distribution (test) ) failed in plasmid_run_start")


def test_observed_train_calls_run_end_with_the_metrics_or_the_error_that_ended_the_run(tmp_path, monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from plasmid.app import run as run_module
    from plasmid.app.runlog import RunLog
    from plasmid.testing import make_config, make_manager

    calls = []

    async def train(session, log):
        return {"train/loss": 1.0}

    async def failing_train(session, log):
        raise RuntimeError("the trainer died\nwith a second line")

    session = SimpleNamespace(startup=SimpleNamespace(manager=make_manager(Tracker(calls))),
                              config=make_config(run_dir=tmp_path))
    monkeypatch.setattr(run_module.loop, "train", train)
    assert asyncio.run(run_module.observed_train(session, RunLog(tmp_path, 1))) == {"train/loss": 1.0}
    monkeypatch.setattr(run_module.loop, "train", failing_train)
    with pytest.raises(RuntimeError, match="the trainer died"):
        asyncio.run(run_module.observed_train(session, RunLog(tmp_path, 1)))
    assert calls == [("Tracker", "run_end", None), ("Tracker", "run_end", "the trainer died")]
