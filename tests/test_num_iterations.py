"""``--num-iterations`` at the command line: a bad value is one line, exit 2, nothing written (the
passes themselves are tested in plugins/trainers/torchtrain/tests/test_torchtrain_num_iterations.py)."""

from __future__ import annotations

import pytest

from plasmid.app.cli import main


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_bad_num_iterations_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, value):
    assert main(["train", f"--num-iterations={value}", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--num-iterations {value}: must be >= 1" in err
    assert not (tmp_path / "run").exists() and list(tmp_path.iterdir()) == []
