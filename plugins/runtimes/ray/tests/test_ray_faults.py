"""Faults of a run whose Ray cluster plasmid starts itself, through ``plasmid train --runtime ray``
in a subprocess (the tiny CPU quickstart, 2 trainer workers):

- a trainer worker killed mid-run ends the run with one error line (exit 2, no traceback) naming
  the rank, the trainer and its plugin, and ``--resume``; the checkpoints left are all complete,
  and ``--resume`` trains from the last one to the end;
- every process of the cluster listens on the loopback address only;
- no process of the cluster outlives the driver by more than a few seconds, whether it exits
  with an error or is SIGKILLed.

Each run's processes are found by its own ``RAY_TMPDIR`` (in every one's environment; Ray's
workers rewrite their command line). Each ``plasmid train`` subprocess dies with this test
process (``PR_SET_PDEATHSIG``): a killed pytest takes its drivers, and their reapers their
clusters, down with it instead of leaving them running.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from plasmid_ray.testing import RAY_ENV  # noqa: E402

STEPS = 12
FLAGS = ["--runtime", "ray", "--trainer-workers", "2", "--engines", "1", "--num-rollouts", str(STEPS),
         "--save-interval", "2", "--eval-interval", "0", "--prompts-per-step", "4", "--n-samples-per-prompt", "4"]
#: Seconds the cluster's processes may outlive their driver.
OUTLIVE_SECONDS = 10.0


@pytest.fixture
def ray_tmp():
    """A short temp dir for one run's Ray session (its unix sockets must stay under ~107 chars)."""
    path = tempfile.mkdtemp(prefix="plasmid-rayf-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def die_with_parent() -> None:
    """In the child before exec: SIGKILL this process when the thread that forked it exits (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Train:
    """``plasmid train`` in a subprocess, its stderr in a file."""

    def __init__(self, run_dir: Path, ray_tmp: str, *extra: str) -> None:
        self.run_dir, self.ray_tmp = run_dir, ray_tmp
        self.log = run_dir.parent / f"{run_dir.name}-{len(list(run_dir.parent.glob('*.log')))}.log"
        env = {**os.environ, **RAY_ENV, "RAY_TMPDIR": ray_tmp, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
        env.pop("RAY_ADDRESS", None)
        with self.log.open("wb") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "plasmid.app.cli", "train", *FLAGS, "--run-dir",
                                             str(run_dir), *extra], stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                            preexec_fn=die_with_parent)

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def steps(self) -> list[int]:
        path = self.run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line)["step"] for line in lines if line.endswith("}")]

    def wait_for(self, what: str, ready, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.process.poll() is not None:
                raise AssertionError(f"plasmid exited ({self.process.returncode}) before {what}:\n{self.stderr}")
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"no {what} after {timeout:.0f} s:\n{self.stderr}")
            time.sleep(0.2)

    def wait(self, timeout: float = 240.0) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"plasmid did not exit in {timeout:.0f} s:\n{self.stderr}") from None

    def trainer_pids(self) -> list[int]:
        found = re.search(r"trainer workers joined .*; pids ([\d, ]+)\)", self.stderr)
        return [int(pid) for pid in found.group(1).split(", ")] if found else []


def cluster_processes(ray_tmp: str) -> list[psutil.Process]:
    """Live processes (zombies are dead) whose command line or environment names ``ray_tmp``."""
    found = []
    for process in psutil.process_iter(["cmdline", "environ", "status"]):
        try:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            texts = [*(process.info["cmdline"] or []), *(process.info["environ"] or {}).values()]
        except psutil.Error:
            continue
        if process.pid != os.getpid() and any(ray_tmp in text for text in texts):
            found.append(process)
    return found


def survivors(ray_tmp: str, within: float = OUTLIVE_SECONDS) -> list[str]:
    """The cluster's processes still alive ``within`` seconds from now (polled)."""
    deadline = time.monotonic() + within
    while (left := cluster_processes(ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return [f"{p.pid} {p.name()}" for p in left if p.is_running()]


def listeners(processes: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of ``processes``."""
    found = []
    for process in processes:
        try:
            for conn in process.net_connections("inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((process.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


@pytest.mark.timeout(600)
def test_a_killed_trainer_worker_is_one_error_line_and_resume_finishes_the_run(tmp_path, ray_tmp):
    run_dir = tmp_path / "run"
    first = Train(run_dir, ray_tmp)
    first.wait_for("a few steps", lambda: len(first.steps()) >= 3 and len(first.trainer_pids()) == 2)

    # every process of the cluster plasmid started listens on loopback only
    sockets = listeners(cluster_processes(ray_tmp))
    assert len(sockets) >= 5, f"expected the GCS, raylet and workers to listen: {sockets}"
    exposed = [s for s in sockets if not is_loopback(s[1])]
    assert not exposed, f"listening beyond loopback: {exposed}"

    os.kill(first.trainer_pids()[1], signal.SIGKILL)
    assert first.wait() == 2, first.stderr
    errors = [line for line in first.stderr.splitlines() if line.startswith("plasmid: error:")]
    assert len(errors) == 1, first.stderr
    assert "Traceback" not in first.stderr, first.stderr
    error = errors[0]
    for part in ("trainer worker rank 1 of 2", f"pid {first.trainer_pids()[1]}", "trainer 'torchtrain'",
                 "plasmid-torchtrain", "--resume", "checkpoints/step_"):
        assert part in error, f"{part!r} missing from: {error}"
    # the cause, as plasmid_ray.deaths words a silent SIGKILL (an OOM kill counted meanwhile names that)
    assert "killed by a signal without a word (SIGKILL" in error or "kernel's OOM killer counted" in error, error
    assert not survivors(ray_tmp), "cluster processes outlived the driver's error exit"

    complete = sorted(p for p in (run_dir / "checkpoints").iterdir() if not p.name.endswith(".partial"))
    assert complete, "no checkpoint was written before the kill"
    for checkpoint in complete:
        meta = json.loads((checkpoint / "meta.json").read_text())
        assert checkpoint.name == f"step_{meta['rollout_id']:06d}" and (checkpoint / "data_source.json").is_file()
    last = json.loads((complete[-1] / "meta.json").read_text())["rollout_id"]
    assert complete[-1].name in error, "the error names the checkpoint --resume continues from"

    resumed = Train(run_dir, ray_tmp, "--resume")
    assert resumed.wait() == 0, resumed.stderr
    steps = resumed.steps()
    assert steps == list(range(STEPS)), f"after resuming from step {last}: {steps}"
    assert (run_dir / "checkpoints" / f"step_{STEPS - 1:06d}" / "meta.json").is_file()
    assert not survivors(ray_tmp), "cluster processes outlived a normal exit"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_no_cluster_process_outlives_a_killed_driver(tmp_path, ray_tmp, how):
    """SIGKILL: the driver dies at once (the reaper sweeps); SIGTERM: it stops after the step in
    progress (a checkpoint, exit 0) and shuts its cluster down."""
    run = Train(tmp_path / "run", ray_tmp)
    run.wait_for("the first step", lambda: len(run.steps()) >= 1 and len(run.trainer_pids()) == 2)
    before = cluster_processes(ray_tmp)
    names = {p.name() for p in before}
    assert {"raylet", "gcs_server"} <= names and any("TrainerWorker" in n or "ray::" in n for n in names), names
    run.process.send_signal(getattr(signal, how))
    code = run.process.wait(120)
    assert code == (-signal.SIGKILL if how == "SIGKILL" else 0), run.stderr
    assert not survivors(ray_tmp), f"cluster processes outlived the driver ended by {how}"
