"""A new run never lands on an old run's directory; --resume continues exactly the run it names,
or says why not, before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from plasmid.app import rundir
from plasmid.app.rundir import StartupWrites, check_run_dir, write_header
from plasmid.errors import UsageError
from plasmid.testing import make_config


def finished_run(run_dir, **options):
    """A run directory as a run with ``options`` leaves it: header, metrics, one checkpoint."""
    config = make_config(run_dir=run_dir, **options)
    write_header(config)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    checkpoint = run_dir / "checkpoints" / "step_000000"
    checkpoint.mkdir(parents=True)
    (checkpoint / "meta.json").write_text(json.dumps({"rollout_id": 0, "weight_version": 1}))
    return config


def add_to_lock(run_dir, entry):
    """Record one more plugin in the run's ``plugins.lock.json``, as if the run had loaded it."""
    lock = json.loads((run_dir / "plugins.lock.json").read_text())
    (run_dir / "plugins.lock.json").write_text(json.dumps([*lock, entry]))


def test_a_new_run_into_a_fresh_or_missing_directory_is_fine(tmp_path):
    check_run_dir(make_config(run_dir=tmp_path / "new"))
    (tmp_path / "empty").mkdir()
    check_run_dir(make_config(run_dir=tmp_path / "empty"))


def test_a_new_run_into_an_old_runs_directory_is_refused_and_nothing_is_touched(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(UsageError, match=r"already holds a run \(metrics.jsonl, config.json, plugins.lock.json, "
                                         r"checkpoints/\); continue it with --resume"):
        check_run_dir(make_config(run_dir=run_dir))
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_resume_without_a_checkpoint_starts_from_step_0_saying_so_in_one_line(tmp_path, capsys):
    """A run killed before its first checkpoint (header and metrics, no checkpoint) is neither
    resumable nor restartable unless ``--resume`` starts it again: a scheduler restarts with it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_run_dir(make_config(run_dir=run_dir, resume=True))
    config = make_config(run_dir=run_dir, temperature=0.7)
    write_header(config)
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    (run_dir / "checkpoints" / "step_000003.partial").mkdir(parents=True)
    capsys.readouterr()
    check_run_dir(make_config(run_dir=run_dir, temperature=0.7, resume=True))
    said = capsys.readouterr().err.strip()
    assert said == (f"plasmid: --resume: {run_dir} holds no complete checkpoint (nothing under "
                    f"{run_dir / 'checkpoints'}); starting the run from step 0")


def test_resume_without_a_checkpoint_of_another_runs_config_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    write_header(make_config(run_dir=run_dir, temperature=0.7))
    with pytest.raises(UsageError, match=r"this run differs .*--temperature 0.7 -> 1.0"):
        check_run_dir(make_config(run_dir=run_dir, temperature=1.0, resume=True))
    check_run_dir(make_config(run_dir=run_dir, temperature=1.0, resume=True, resume_allow_changes=True))


def test_a_resume_without_a_checkpoint_writes_the_header_afresh(tmp_path):
    run_dir = tmp_path / "run"
    write_header(make_config(run_dir=run_dir, temperature=0.7))
    write_header(make_config(run_dir=run_dir, temperature=1.0, resume=True, resume_allow_changes=True))
    assert json.loads((run_dir / "config.json").read_text())["option"]["temperature"] == 1.0


def test_resume_with_the_same_options_continues(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir, temperature=0.7)
    check_run_dir(make_config(run_dir=run_dir, temperature=0.7, resume=True, num_rollouts=900))


def test_resume_with_other_options_lists_them_and_refuses(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir, temperature=0.7)
    with pytest.raises(UsageError) as caught:
        check_run_dir(make_config(run_dir=run_dir, temperature=1.0, top_k=5, resume=True))
    message = str(caught.value)
    assert "--temperature 0.7 -> 1.0" in message and "--top-k 0 -> 5" in message
    assert "--resume-allow-changes" in message and "\n" not in message
    check_run_dir(make_config(run_dir=run_dir, temperature=1.0, resume=True, resume_allow_changes=True))


def drop_from_header(run_dir, name):
    """Remove option ``name`` from the run's ``config.json``, as if the run predated that option."""
    header = json.loads((run_dir / "config.json").read_text())
    del header["option"][name]
    (run_dir / "config.json").write_text(json.dumps(header))


def test_an_option_newer_than_the_run_left_at_its_default_does_not_block_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    drop_from_header(run_dir, "top_k")  # an upgrade added --top-k after the run started
    check_run_dir(make_config(run_dir=run_dir, resume=True))
    with pytest.raises(UsageError, match=r"--top-k unset -> 5"):  # set on the resume: a real change
        check_run_dir(make_config(run_dir=run_dir, resume=True, top_k=5))


def test_resume_with_another_plugin_set_lists_it(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    add_to_lock(run_dir, {"name": "judge", "distribution": "rl-judge", "version": "1.2", "target": "rl_judge.plugin"})
    with pytest.raises(UsageError, match="plugin judge 1.2 -> absent"):
        check_run_dir(make_config(run_dir=run_dir, resume=True))


def test_a_resume_never_rewrites_the_runs_header(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir, temperature=0.7)
    header = (run_dir / "config.json").read_text()
    write_header(make_config(run_dir=run_dir, temperature=0.7, resume=True, num_rollouts=900))
    assert (run_dir / "config.json").read_text() == header


def test_a_local_module_plugin_that_is_gone_is_named_with_where_it_was(tmp_path):
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    add_to_lock(run_dir, {"name": "killer", "distribution": "(local)", "version": "", "target": "/tmp/killer.py"})
    with pytest.raises(UsageError, match=r"plugin killer \(/tmp/killer.py\) -> absent"):
        check_run_dir(make_config(run_dir=run_dir, resume=True))


def test_a_run_dir_under_a_file_or_a_dangling_link_is_refused_without_writing(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UsageError, match=rf"^--run-dir {tmp_path}/afile/run: {tmp_path}/afile is a file, not a dir"):
        check_run_dir(make_config(run_dir=tmp_path / "afile" / "run"))
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    with pytest.raises(UsageError, match="is a broken symbolic link"):
        check_run_dir(make_config(run_dir=tmp_path / "link" / "run"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "link"]


def test_a_read_only_run_dir_is_named_even_for_root(tmp_path, monkeypatch):
    """``os.access`` sees read-only mounts and immutable files for root too; here it is made to
    answer as it does on a read-only mount."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == run_dir else real_access(path, mode))
    monkeypatch.setattr(rundir, "_read_only", lambda path: True)
    with pytest.raises(UsageError, match=rf"^--run-dir {run_dir}: {run_dir} is on a read-only file system; choose"):
        check_run_dir(make_config(run_dir=run_dir))
    with pytest.raises(UsageError, match=rf"^--run-dir {run_dir / 'new'}: {run_dir} is on a read-only file system"):
        check_run_dir(make_config(run_dir=run_dir / "new"))


def test_a_resume_whose_checkpoints_cannot_be_written_is_refused(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    real_access, checkpoints = os.access, run_dir / "checkpoints"
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != checkpoints and real_access(path, mode))
    with pytest.raises(UsageError, match=rf"{checkpoints} is not writable \(permission denied\)"):
        check_run_dir(make_config(run_dir=run_dir, resume=True))


def test_a_failed_start_up_removes_what_it_created_and_only_that(tmp_path):
    new = tmp_path / "a" / "b" / "run"
    with pytest.raises(RuntimeError), StartupWrites(new):
        (new / "model").mkdir(parents=True)
        raise RuntimeError("engine failed")
    assert not (tmp_path / "a").exists()

    old = tmp_path / "old"
    finished_run(old)
    before = sorted(p.relative_to(old) for p in old.rglob("*"))
    with pytest.raises(RuntimeError), StartupWrites(old):
        (old / "sglang").mkdir()
        (old / "sglang" / "server.log").write_text("log")
        (old / "stray.txt").write_text("x")
        raise RuntimeError("engine failed")
    assert sorted(p.relative_to(old) for p in old.rglob("*")) == before

    with StartupWrites(new) as writes:
        (new / "model").mkdir(parents=True)
    assert (new / "model").is_dir()
    with pytest.raises(RuntimeError), StartupWrites(tmp_path / "kept") as writes:
        (tmp_path / "kept").mkdir()
        writes.keep()
        raise RuntimeError("after training began")
    assert (tmp_path / "kept").is_dir()
