"""``--save-rollouts`` and ``plasmid replay``: the saved format round-trips, damage is one line,
and a replay of a saved run reproduces its training metrics bit for bit."""

from __future__ import annotations

import io
import json
import math

import pytest
from plasmid_e2e import read_metrics, run_plasmid

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


class _Impl:
    def __init__(self, plugin_name, function, argnames):
        self.plugin_name, self.function, self.argnames = plugin_name, function, argnames


class _Manager:
    """Just what notify_run_* read: ``pm.hook.<name>.get_hookimpls()``."""

    def __init__(self, **impls):
        hooks = {name: type("Caller", (), {"get_hookimpls": lambda self, i=i: i})() for name, i in impls.items()}
        self.pm = type("PM", (), {"hook": type("Hook", (), hooks)()})()


def test_a_failing_run_end_observer_is_one_warning_and_the_others_still_run(tmp_path):
    from plasmid.app.run import notify_run_end, notify_run_start
    from plasmid.testing import make_config

    calls = []

    def broken(run_dir, metrics, error):
        raise RuntimeError("tracker down")

    manager = _Manager(
        plasmid_run_end=[_Impl("good", lambda error: calls.append(error), ("error",)),
                         _Impl("bad", broken, ("run_dir", "metrics", "error"))],
        plasmid_run_start=[_Impl("starter", lambda run_dir: (_ for _ in ()).throw(OSError("no disk")), ("run_dir",))])
    config = make_config(run_dir=tmp_path)
    stream = io.StringIO()
    notify_run_end(manager, config, {}, "boom", stream=stream)
    assert calls == ["boom"]
    assert stream.getvalue() == "plasmid: warning: plugin 'bad' failed in plasmid_run_end: RuntimeError: tracker down\n"
    with pytest.raises(PlasmidError, match="plugin 'starter' failed in plasmid_run_start: OSError: no disk"):
        notify_run_start(manager, config)


def test_observed_train_calls_run_end_with_the_error_of_a_failing_run_start(tmp_path, monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from plasmid.app import run as run_module
    from plasmid.app.runlog import RunLog
    from plasmid.testing import make_config

    ended, trained = [], []

    async def train(session, log):
        trained.append(True)
        return {"train/loss": 1.0}

    monkeypatch.setattr(run_module.loop, "train", train)

    def failing_start(run_dir):
        raise RuntimeError("cannot open the tracker")

    manager = _Manager(plasmid_run_start=[_Impl("tracker", failing_start, ("run_dir",))],
                       plasmid_run_end=[_Impl("tracker", lambda metrics, error: ended.append((metrics, error)),
                                              ("metrics", "error"))])
    config = make_config(run_dir=tmp_path)
    session = SimpleNamespace(startup=SimpleNamespace(manager=manager), config=config)
    with pytest.raises(PlasmidError, match="plugin 'tracker' failed in plasmid_run_start"):
        asyncio.run(run_module.observed_train(session, RunLog(tmp_path, 1, stream=io.StringIO())))
    assert not trained and ended == [({}, "plugin 'tracker' failed in plasmid_run_start: RuntimeError: cannot open "
                                          "the tracker")]

    manager = _Manager(plasmid_run_start=[], plasmid_run_end=[_Impl("t", lambda metrics, error:
                                                                    ended.append((metrics, error)),
                                                                    ("metrics", "error"))])
    session = SimpleNamespace(startup=SimpleNamespace(manager=manager), config=config)
    assert asyncio.run(run_module.observed_train(session, RunLog(tmp_path, 1))) == {"train/loss": 1.0}
    assert ended[-1] == ({"train/loss": 1.0}, None)
