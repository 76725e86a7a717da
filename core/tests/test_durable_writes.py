"""Write failures and torn files: a full disk mid-write, a torn last line of ``metrics.jsonl``,
a failed checkpoint save; each leaves the previous complete state and is reported in one line
naming the path."""

from __future__ import annotations

import asyncio
import errno
import json
import os
from pathlib import Path

import pytest

from plasmid import atomic
from plasmid.app import cli
from plasmid.app.runlog import RunLog
from plasmid.checkpoint import Checkpoints
from plasmid.errors import CheckpointError, PlasmidError


class Trainer:
    """Writes ``weights.bin``; ``fail`` is raised from inside the save."""

    def __init__(self, fail=None):
        self.fail = fail

    async def save(self, path):
        Path(path).mkdir(parents=True)
        (Path(path) / "weights.bin").write_bytes(b"w" * 64)
        if self.fail is not None:
            raise self.fail

    async def load(self, path):
        pass


class Source:
    def state_dict(self):
        return {"position": 3}

    def load_state_dict(self, state):
        pass


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_during_an_atomic_rewrite_keeps_the_old_file_and_names_the_path(tmp_path, monkeypatch):
    target = tmp_path / "config.json"
    atomic.write_atomic(target, "old")
    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError) as failed:
        atomic.write_atomic(target, "new")
    assert failed.value.errno == errno.ENOSPC and failed.value.filename is not None
    assert Path(failed.value.filename).parent == tmp_path
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"], "the temporary file was left behind"


def test_a_full_disk_while_making_the_metrics_durable_names_the_file(tmp_path, monkeypatch):
    log = RunLog(tmp_path, 10)
    log.write(0, {"rollout/reward_mean": 0.5})
    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError) as failed:
        log.make_durable()
    assert failed.value.filename == str(tmp_path / "metrics.jsonl")
    assert cli.disk_error(failed.value) == (f"disk full writing {tmp_path / 'metrics.jsonl'} "
                                            f"(No space left on device)")


def test_resume_drops_a_torn_last_line_of_the_metrics_log(tmp_path, capsys):
    lines = [json.dumps({"step": step, "rollout/reward_mean": 0.1 * step}) for step in range(3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 3, "rollout/rew')
    log = RunLog(tmp_path, 10)
    log.resume_from(3)
    assert [entry["step"] for entry in log.history] == [0, 1, 2]
    assert (tmp_path / "metrics.jsonl").read_text() == "\n".join(lines) + "\n"
    assert "dropped a torn last line 4" in capsys.readouterr().err
    log.write(3, {"rollout/reward_mean": 0.3})
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]


def test_a_damaged_line_before_the_last_is_one_error_naming_the_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(PlasmidError, match=r"metrics.jsonl, line 2: not a metrics entry"):
        RunLog(tmp_path, 10).resume_from(2)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\nnot json\n{"step": 1}\n'


def test_a_checkpoint_save_failing_on_a_full_disk_leaves_the_previous_one_intact(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=1)
    asyncio.run(checkpoints.save(1, Trainer(), Source().state_dict(), {"weight_version": 2}))
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "checkpoints/step_000002.partial/x"))
    with pytest.raises(OSError) as failed:
        asyncio.run(checkpoints.save(2, Trainer(fail=full), Source().state_dict(), {"weight_version": 3}))
    assert cli.disk_error(failed.value).startswith(f"disk full writing {tmp_path / 'checkpoints'}")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"], "partial left behind"
    latest = checkpoints.latest()
    assert latest.name == "step_000001" and (latest / "trainer" / "weights.bin").read_bytes() == b"w" * 64
    assert json.loads((latest / "meta.json").read_text())["weight_version"] == 2


def test_a_full_disk_while_writing_the_checkpoints_own_files_leaves_the_previous_one(tmp_path, monkeypatch):
    checkpoints = Checkpoints(tmp_path, keep=1)
    asyncio.run(checkpoints.save(1, Trainer(), Source().state_dict(), {}))
    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError) as failed:
        asyncio.run(checkpoints.save(2, Trainer(), Source().state_dict(), {}))
    assert "step_000002.partial" in failed.value.filename
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]


def test_saving_the_same_step_again_keeps_a_complete_checkpoint_of_it(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=1)
    asyncio.run(checkpoints.save(1, Trainer(), Source().state_dict(), {"weight_version": 1}))
    asyncio.run(checkpoints.save(1, Trainer(), Source().state_dict(), {"weight_version": 9}))
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000001"]
    assert json.loads((checkpoints.latest() / "meta.json").read_text())["weight_version"] == 9


def test_a_trainer_save_failing_otherwise_is_one_error_naming_the_trainer_and_what_is_left(tmp_path):
    checkpoints = Checkpoints(tmp_path, trainer_label="trainer 'fake' from plugin 'fakes'")
    asyncio.run(checkpoints.save(1, Trainer(), Source().state_dict(), {}))
    with pytest.raises(CheckpointError) as failed:
        asyncio.run(checkpoints.save(2, Trainer(fail=RuntimeError("file write failed")), Source().state_dict(), {}))
    message = str(failed.value)
    assert message.startswith("trainer 'fake' from plugin 'fakes' failed to save a checkpoint to ")
    assert "RuntimeError: file write failed" in message and "step_000001 is intact" in message


def test_a_checkpoint_with_a_torn_meta_file_is_not_complete(tmp_path):
    checkpoints = Checkpoints(tmp_path)
    asyncio.run(checkpoints.save(1, Trainer(), Source().state_dict(), {}))
    asyncio.run(checkpoints.save(2, Trainer(), Source().state_dict(), {}))
    (tmp_path / "checkpoints" / "step_000002" / "meta.json").write_text('{"rollout_id": 2, "sav')
    assert checkpoints.latest().name == "step_000001"


@pytest.mark.parametrize(("code", "expected"), [
    (errno.ENOSPC, "disk full writing /data/run/metrics.jsonl"),
    (errno.EDQUOT, "disk quota exceeded writing /data/run/metrics.jsonl"),
    (errno.EROFS, "read-only file system: cannot write /data/run/metrics.jsonl"),
    (errno.EACCES, "permission denied: /data/run/metrics.jsonl"),
])
def test_the_cli_reports_a_storage_fault_in_one_line_and_the_traceback_only_with_debug(
        monkeypatch, capsys, code, expected):
    def failing_train(argv):
        try:
            raise OSError(code, os.strerror(code), "/data/run/metrics.jsonl")
        except OSError as exc:
            raise RuntimeError("during shutdown") from exc  # a chained error is reported by its cause

    monkeypatch.setattr(cli, "cmd_train", failing_train if code in cli.STORAGE_FULL else raising(code))
    assert cli.main(["train"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"plasmid: error: {expected} ({os.strerror(code)})"]
    assert cli.main(["train", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1] == f"plasmid: error: {expected} ({os.strerror(code)})"


def raising(code):
    def train(argv):
        raise OSError(code, os.strerror(code), "/data/run/metrics.jsonl")
    return train


def test_other_errors_still_raise_from_the_cli(monkeypatch):
    monkeypatch.setattr(cli, "cmd_train", lambda argv: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cli.main(["train"])

    def bug_after_a_refused_read(argv):
        try:
            raise PermissionError(errno.EACCES, "Permission denied", "/etc/shadow")
        except OSError:
            return {}["missing"]

    monkeypatch.setattr(cli, "cmd_train", bug_after_a_refused_read)
    with pytest.raises(KeyError):
        cli.main(["train"])



def test_a_steps_line_is_not_fsynced_when_written_but_when_made_durable_and_at_close(tmp_path, fsync_events):
    events = fsync_events
    log = RunLog(tmp_path, 10, plot_seconds=1e9)
    for step in range(3):
        log.write(step, {"rollout/reward_mean": 0.5})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3   # in the OS cache at once
    assert "fsync metrics.jsonl" not in events
    log.make_durable()
    assert events.count("fsync metrics.jsonl") == 1
    log.close()
    assert events.count("fsync metrics.jsonl") == 2
