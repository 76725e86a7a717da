"""Helpers of the cross-package tests: run the CLI in a subprocess, install fixture packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"

#: A few steps of the quickstart, small enough for a test (seconds).
SHORT_RUN = ["--num-rollouts", "2", "--prompts-per-step", "4", "--n-samples-per-prompt", "4",
             "--eval-interval", "1", "--save-interval", "0"]


def run_plasmid(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                timeout: float = 300) -> subprocess.CompletedProcess:
    """``plasmid ARGS`` in a fresh interpreter; ``env`` entries are added to this environment."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "plasmid.app.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True,
                   capture_output=True, text=True)


def install_to_target(package: str, target: Path) -> Path:
    """Build and install fixture ``package`` (a folder under tests/fixtures) into ``target``,
    a directory that only subprocesses given ``PYTHONPATH=target`` see."""
    pip("install", "--no-deps", "--target", str(target), str(FIXTURES / package))
    return target


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
