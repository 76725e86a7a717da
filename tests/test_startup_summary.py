"""The start-up summary of ``plasmid train``: the plugins on one line (``-v``/``--verbose``: one a line with the
distribution and version), and the reward chosen when ``--reward`` was not given named (issue 35)."""

from __future__ import annotations

import pytest

from plasmid.app.cli import main
from plasmid.app.rundir import RESUMABLE_CHANGES
from plasmid.app.start import start
from plasmid.app.summary import add_train_options, describe_plugins


def summary(*argv: str) -> str:
    return describe_plugins(start(list(argv), add_options=add_train_options))


def test_the_plugins_are_one_line_and_the_default_reward_is_named():
    text = summary()
    lines = text.splitlines()
    assert len(lines) == 3 and lines[0].startswith("plasmid plugins (") and "-v lists" in lines[0]
    assert "grpo" in lines[0] and "plasmid-grpo" not in text
    assert lines[1].startswith("providers: ") and "reward=exact" in lines[1]
    assert lines[2].startswith("reward: exact (the default: --reward was not given")


@pytest.mark.parametrize("flag", ["-v", "--verbose"])
def test_verbose_lists_each_plugin_with_its_distribution(flag):
    lines = summary(flag, "--reward", "exact").splitlines()
    assert lines[0] == "plasmid plugins:" and any(line.split() == ["grpo", "plasmid-grpo", "0.1.0"] for line in lines)
    assert not any(line.startswith("reward: ") for line in lines)   # given: nothing to point out
    assert summary(flag, "--no-verbose").splitlines()[0].startswith("plasmid plugins (")


def test_verbose_changes_nothing_a_resume_compares():
    assert "verbose" in RESUMABLE_CHANGES


def test_a_bad_verbose_value_is_one_line(tmp_path, capsys):
    assert main(["train", "--verbose=3", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--verbose" in err and not (tmp_path / "run").exists()
    config = tmp_path / "run.toml"
    config.write_text("verbose = 3\n")
    assert main(["train", "--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "verbose: expected true or false" in err and not (tmp_path / "run").exists()
