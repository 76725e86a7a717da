"""``debug: true`` in a ``--config`` file shows tracebacks as ``--debug`` does; a flag overrides it."""

from __future__ import annotations

import pytest

from plasmid.app import cli
from plasmid.errors import UsageError


@pytest.fixture
def failing_train(monkeypatch):
    def train(argv):
        raise UsageError("the data source has no prompts")

    monkeypatch.setattr(cli, "cmd_train", train)


@pytest.mark.parametrize(("name", "text"), [
    ("run.yaml", "debug: true\nnum_rollouts: 2\n"),
    ("run.yaml", "general:\n  debug: true\n"),
    ("run.toml", "debug = true\n"),
    ("run.json", '{"debug": true}'),
])
def test_debug_in_a_config_file_shows_the_traceback(tmp_path, capsys, failing_train, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert cli.main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == "plasmid: error: the data source has no prompts"


@pytest.mark.parametrize(("text", "argv", "traceback"), [
    ("debug: false\n", [], False),
    ("num_rollouts: 2\n", [], False),
    ("debug: true\n", ["--no-debug"], False),     # flags override the file
    ("debug: false\n", ["--debug"], True),
])
def test_the_command_line_overrides_the_file(tmp_path, capsys, failing_train, text, argv, traceback):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert cli.main(["train", "--config", str(path), *argv]) == 2
    err = capsys.readouterr().err
    assert ("Traceback" in err) is traceback
    assert err.splitlines()[-1] == "plasmid: error: the data source has no prompts"


def test_debug_in_an_args_file_and_the_last_config_file_wins(tmp_path, capsys, failing_train):
    (tmp_path / "args.txt").write_text("--debug\n")
    assert cli.main(["train", f"@{tmp_path / 'args.txt'}"]) == 2
    assert "Traceback" in capsys.readouterr().err
    (tmp_path / "a.yaml").write_text("debug: true\n")
    (tmp_path / "b.yaml").write_text("debug: false\n")
    assert cli.main(["train", "--config", str(tmp_path / "a.yaml"), "--config", str(tmp_path / "b.yaml")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_unreadable_config_file_is_still_one_line(tmp_path, capsys):
    assert cli.main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"plasmid: error: --config {tmp_path / 'missing.yaml'}: no such file"]
