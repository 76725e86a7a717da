"""A run's ``config.json`` read by ``plasmid eval``, ``score`` and ``rollout`` (:mod:`plasmid.app.runconfig`):
found from ``--checkpoint``, read first so files and flags win, its ``train``-only keys and the keys naming
where it wrote ignored (not refused), and each command's own options first in its ``--help``.

The rewards come from a local plugin file, so these run in the kernel's env (no torch, no plugins)."""

from __future__ import annotations

import io
import json

import pytest

from plasmid.app.cli import main
from plasmid.app.runconfig import PLACE_KEYS, RunConfigFiles, data_text, run_config_of, run_of, with_run_config
from plasmid.app.score import score_command
from plasmid.errors import UsageError

REWARDS = '''
from plasmid import hookimpl


class Contains:
    """1.0 when the label occurs in the response."""

    def __init__(self, config):
        pass

    async def __call__(self, sample):
        return float(str(sample.label) in sample.response)


class Length:
    def __init__(self, config):
        pass

    async def __call__(self, sample):
        return float(len(sample.response))


@hookimpl
def plasmid_rewards(register):
    register("contains", Contains)
    register("length", Length)
'''


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "rewards_plugin.py"
    path.write_text(REWARDS)
    return str(path)


def write_run(root, option, *, checkpoint=True):
    """A run directory as ``plasmid train`` leaves it: ``config.json`` and (with ``checkpoint``) one complete
    checkpoint ``step_000003`` with a ``trainer/model`` directory."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"option": option, "plugin_lock": [], "run_dir": str(root)}))
    if checkpoint:
        step = root / "checkpoints" / "step_000003"
        (step / "trainer" / "model").mkdir(parents=True)
        (step / "meta.json").write_text(json.dumps({"rollout_id": 3}))
    return root


def test_a_run_config_keeps_the_commands_keys_and_drops_train_only_and_place_keys(tmp_path):
    run = write_run(tmp_path / "run", {"max_new_tokens": 7, "save_rollouts": "x", "run_dir": "r", "resume": True,
                                       "num_rollouts": 9, "reward_weights": [["a", 1.0]], "lr": 0.1})
    options = {"max_new_tokens", "save_rollouts", "run_dir", "resume", "lr"}
    assert RunConfigFiles().values(str(run / "config.json"), options, set()) == {"max_new_tokens": 7, "lr": 0.1}
    assert {"run_dir", "save_rollouts", "resume"} <= PLACE_KEYS


def test_any_other_file_is_still_checked_as_train_checks_it(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"max_new_tokens": 7, "num_rollout": 2}))
    with pytest.raises(UsageError, match="unknown option 'num_rollout'"):
        RunConfigFiles().values(str(path), {"max_new_tokens", "num_rollouts"}, set())


def test_checkpoint_finds_its_run_config_and_model_first_so_files_and_flags_win(tmp_path):
    run = write_run(tmp_path / "run", {})
    step = run / "checkpoints" / "step_000003"
    for given in (run, step):
        assert run_of(given) == run and run_config_of(given) == run / "config.json"
        assert with_run_config(["--checkpoint", str(given), "--lr", "1"]) == [
            "--config", str(run / "config.json"), "--checkpoint", str(given), "--lr", "1",
            "--model", str(step / "trainer" / "model")]
    assert with_run_config(["--checkpoint", str(run), "--model", "m"])[-2:] == ["--model", "m"]
    assert with_run_config(["--checkpoint", str(run)], model=False) == [
        "--config", str(run / "config.json"), "--checkpoint", str(run)]
    assert with_run_config(["--lr", "1"]) == ["--lr", "1"]


def test_bad_checkpoints_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="--checkpoint .*/nope: no such directory"):
        with_run_config(["--checkpoint", str(tmp_path / "nope")])
    with pytest.raises(UsageError, match="neither a run directory"):
        with_run_config(["--checkpoint", str(tmp_path)], model=False)
    bare = write_run(tmp_path / "bare", {})
    (bare / "config.json").unlink()
    with pytest.raises(UsageError, match="its run has no config.json"):
        with_run_config(["--checkpoint", str(bare)])
    (bare / "config.json").write_text('{"lr": 1}')
    with pytest.raises(UsageError, match="is not a run's configuration"):
        with_run_config(["--checkpoint", str(bare)])
    empty = write_run(tmp_path / "empty", {}, checkpoint=False)
    (empty / "checkpoints").mkdir()
    with pytest.raises(UsageError, match="holds no complete checkpoint"):
        with_run_config(["--checkpoint", str(empty)])


def test_data_text_names_the_split_options_of_the_source():
    from argparse import Namespace

    assert data_text(Namespace(datasource="hf", hf_path="gsm8k", hf_eval_split="test", hf_split="train"),
                     "eval") == "data source hf (hf_path=gsm8k, hf_eval_split=test)"
    assert data_text(Namespace(datasource="jsonl", prompt_data="t.jsonl", eval_prompt_data=None), "eval") == \
        "data source jsonl"
    assert data_text(Namespace(datasource="mine"), "train") == "data source mine"


def test_score_reads_a_runs_rewards_from_its_checkpoint_or_its_config(plugin, tmp_path, capsys):
    run = write_run(tmp_path / "run", {"reward": ["length"], "reward_weights": [["length", 1.0]],
                                       "save_rollouts": str(tmp_path / "saved"), "num_rollouts": 5,
                                       "plugins": plugin})
    for args in (["--checkpoint", str(run)], ["--checkpoint", str(run / "checkpoints" / "step_000003")],
                 ["--config", str(run / "config.json")]):
        out = io.StringIO()
        assert score_command(args, io.StringIO("abc\n"), out) == 0
        assert json.loads(out.getvalue())["components"] == {"length": 3.0}
        assert "plasmid score: 1 lines from stdin scored with length:1" in capsys.readouterr().err
    out = io.StringIO()   # the command line wins over the run's config
    assert score_command(["--checkpoint", str(run), "--reward", "contains", "--label", "b"],
                         io.StringIO("abc\n"), out) == 0
    assert json.loads(out.getvalue())["components"] == {"contains": 1.0}
    assert not (tmp_path / "saved").exists()


def test_score_checkpoint_bad_value_is_one_line_exit_2(plugin, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("abc\n"))
    assert main(["score", "--plugins", plugin, "--reward", "length", "--checkpoint", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--checkpoint" in err and "no such directory" in err


@pytest.mark.parametrize(("command", "own"), [("eval", "plasmid eval:"), ("score", "score:"),
                                              ("rollout", "plasmid rollout:")])
def test_each_commands_help_lists_its_own_options_first(command, own, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([command, "--help"])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    sections = [line for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert sections[:2] == ["help:", own], sections[:4]
    assert "--checkpoint DIR" in text.split("common:")[0]
