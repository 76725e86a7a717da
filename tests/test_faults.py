"""Faults injected into real ``plasmid train`` runs of the tiny quickstart: SIGTERM mid-run
(checkpoint, exit 0, resume as one run), a disk that fills up (one line naming the path, the
previous checkpoint intact), a NaN reward weight (refused before anything is written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from plasmid_e2e import read_metrics, run_plasmid

TINY = ["--prompts-per-step", "4", "--n-samples-per-prompt", "4", "--eval-interval", "0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def steps_in(run_dir: Path) -> list[int]:
    return [entry["step"] for entry in read_metrics(run_dir)]


def checkpoints_in(run_dir: Path) -> list[str]:
    return sorted(path.name for path in (run_dir / "checkpoints").iterdir())


@pytest.mark.timeout(300)
def test_sigterm_mid_run_checkpoints_the_last_step_exits_0_and_resumes_as_one_run(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "plasmid.app.cli", "train", *TINY, "--num-rollouts", "200",
                             "--save-interval", "1000", "--run-dir", str(run_dir)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 200
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the run logged no steps"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=200)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    before = read_metrics(run_dir)
    stopped = [entry["step"] for entry in before]
    last = stopped[-1]
    assert stopped == list(range(last + 1)) and last < 199
    assert f"stopped by SIGTERM after step {last}" in err
    assert checkpoints_in(run_dir) == [f"step_{last:06d}"], "no checkpoint of the last finished step"

    resumed = run_plasmid("train", *TINY, "--num-rollouts", str(last + 3), "--save-interval", "1000",
                          "--run-dir", str(run_dir), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert steps_in(run_dir) == list(range(last + 3)), "the metrics log does not read as one run"
    assert read_metrics(run_dir)[:last + 1] == before, "the resume rewrote the steps before it"
    meta = json.loads((run_dir / "checkpoints" / f"step_{last + 2:06d}" / "meta.json").read_text())
    assert meta["rollout_id"] == last + 2


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: the quickstart's header, model and one checkpoint fit, a second does not."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.timeout(300)
def test_a_full_disk_is_one_line_naming_the_path_and_leaves_the_previous_checkpoint(small_disk):
    run_dir = small_disk / "run"
    proc = run_plasmid("train", *TINY, "--num-rollouts", "4", "--save-interval", "1", "--keep-checkpoints", "1",
                       "--run-dir", str(run_dir))
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0].startswith(f"plasmid: error: disk full writing {run_dir}"), errors[0]
    assert checkpoints_in(run_dir) == ["step_000000"], "a partial checkpoint was left or the previous one removed"
    assert json.loads((run_dir / "checkpoints" / "step_000000" / "meta.json").read_text())["rollout_id"] == 0
    assert steps_in(run_dir)[0] == 0


def test_a_nan_reward_weight_is_refused_in_one_line_before_the_run_directory_is_made(tmp_path):
    proc = run_plasmid("train", "--reward", "exact:nan", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == ("plasmid: error: --reward 'exact:nan': the weight after ':' "
                                                    "must be a finite number, not nan")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
