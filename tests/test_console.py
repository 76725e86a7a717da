"""What a run shows on the terminal (plasmid.app.console): a phase over a second reports itself, and
library warnings and log records go to ``<run dir>/run.log``, the terminal keeping plasmid's own lines
(``-v`` shows them too). In process for the phases, a real ``plasmid train`` with a local plugin for
the routing."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from plasmid_e2e import run_plasmid

from plasmid.app.console import LOG_FILE, LibraryLogs, Phase, ReportingDriver, report_checkpoints


def test_a_phase_over_a_second_reports_itself_and_a_short_one_is_silent():
    lines: list[str] = []
    with Phase("loading the model", lines.append):
        time.sleep(1.3)
    assert lines[0] == "plasmid: loading the model..."
    assert lines[1].startswith("plasmid: loading the model: done in 1.") and lines[1].endswith(" s")
    quiet: list[str] = []
    with Phase("quick", quiet.append):
        time.sleep(0.05)
    time.sleep(1.1)  # past the announcement time: a phase already left stays silent
    assert quiet == []


def test_a_failed_phase_says_so():
    lines: list[str] = []
    with pytest.raises(RuntimeError), Phase("warming up", lines.append, after=0.1):
        time.sleep(0.3)
        raise RuntimeError("boom")
    assert lines[0] == "plasmid: warming up..." and lines[1].startswith("plasmid: warming up: failed after 0.")


class SlowDriver:
    async def run(self, ctx, rollout_id):
        return rollout_id

    async def evaluate(self, ctx, groups, params):
        await asyncio.sleep(1.2)
        return {"eval/accuracy": 0.5}


class SlowTrainer:
    def __init__(self):
        self.saved = []

    async def save(self, path):
        await asyncio.sleep(1.2)
        self.saved.append(path)


def test_slow_evaluations_and_checkpoints_of_a_run_report_themselves():
    lines: list[str] = []
    driver, trainer = ReportingDriver(SlowDriver(), lines.append), SlowTrainer()
    report_checkpoints(trainer, lines.append)

    async def go():
        assert await driver.run(None, 3) == 3
        assert await driver.evaluate(None, [1, 2], None) == {"eval/accuracy": 0.5}
        await trainer.save("/r/checkpoints/step_000007/trainer")

    asyncio.run(go())
    assert trainer.saved == ["/r/checkpoints/step_000007/trainer"]
    assert [line.split(":")[1].strip().rstrip(".") for line in lines] == [
        "evaluating 2 prompt groups", "evaluating 2 prompt groups", "writing checkpoint step_000007",
        "writing checkpoint step_000007"]


def test_library_logs_restore_the_logging_they_found(tmp_path, capsys):
    library = logging.getLogger("transformers")
    own = logging.StreamHandler()   # stderr at this time: a library's own terminal handler
    library.addHandler(own)
    library.propagate = False
    try:
        with LibraryLogs(tmp_path) as logs:
            logs.start()
            assert own not in library.handlers and library.propagate
            library.warning("routed")
            logging.getLogger("plasmid_probe").warning("kept on the terminal")
        assert own in library.handlers and library.propagate is False
        assert "routed" in (tmp_path / LOG_FILE).read_text()
        err = capsys.readouterr().err
        assert "kept on the terminal" in err and "routed" not in err
    finally:
        library.removeHandler(own)
        library.propagate = True


PLUGIN = '''
import logging
import warnings

from plasmid import hookimpl


@hookimpl
def plasmid_metrics(step, metrics):
    if step == 0:
        warnings.warn("probe warning of a library", UserWarning)
        logging.getLogger("transformers").warning("probe record of transformers")
        logging.getLogger("torch.distributed.checkpoint").warning("probe record of DCP")
        logging.getLogger("plasmid_probe").warning("probe line of plasmid")
'''
LIBRARY_LINES = ("probe warning of a library", "probe record of transformers", "probe record of DCP")
RUN = ["--num-rollouts", "1", "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
       "--save-interval", "0"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("verbose", [False, True])
def test_library_warnings_of_a_run_go_to_its_log_file(tmp_path, verbose):
    plugin = tmp_path / "noisy.py"
    plugin.write_text(PLUGIN)
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--plugins", str(plugin), *RUN, "--run-dir", str(run_dir), *(["-v"] if verbose else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (run_dir / LOG_FILE).read_text()
    for line in LIBRARY_LINES:
        assert line in log
        assert (line in proc.stderr) is verbose, (line, proc.stderr[-2000:])
    assert "WARNING transformers: probe record of transformers" in log
    assert "WARNING py.warnings:" in log and "UserWarning" in log
    assert "probe line of plasmid" in proc.stderr
