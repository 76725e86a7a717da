"""``plasmid new-plugin reward NAME`` writes a package that pip installs, that passes its own tests
(the reward contract included), and that plasmid then scores and trains with, unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from plasmid_e2e import SHORT_RUN, pip, read_metrics, run_plasmid

EMBEDDED = "hf,tasks,torchgen,rollout,torchtrain,grpo,sync"
NAME = "contains-label"


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory):
    """The scaffolded package's root and the directory it was pip-installed into."""
    where = tmp_path_factory.mktemp("scaffold")
    proc = run_plasmid("new-plugin", "reward", NAME, "--dir", str(where))
    assert proc.returncode == 0, proc.stderr
    root = where / f"rl-plugin-{NAME}"
    target = where / "installed"
    pip("install", "--no-deps", "--target", str(target), str(root))
    return root, target


def test_the_scaffold_installs_and_passes_its_own_tests(scaffold):
    root, target = scaffold
    assert (target / "plasmid_contains_label" / "plugin.py").is_file()
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(root / "tests")],
                          capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " passed" in proc.stdout and "failed" not in proc.stdout
    assert "RewardContract" in (root / "tests" / "test_contains_label_reward.py").read_text()


def test_plasmid_lists_it_and_scores_with_it(scaffold):
    _, target = scaffold
    env = {"PYTHONPATH": str(target)}
    listed = run_plasmid("plugins", "--json", env=env)
    plugin = {p["name"]: p for p in json.loads(listed.stdout)}[NAME]
    assert plugin["distribution"] == f"rl-plugin-{NAME}" and plugin["providers"] == {"reward": [NAME]}
    scored = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "score", "--plugins", NAME, "--reward", NAME,
                             "--label", "42"], input="The answer is 42\nno idea\n", capture_output=True, text=True,
                            env={**os.environ, **env}, timeout=120)
    assert scored.returncode == 0, scored.stderr
    assert [json.loads(line)["reward"] for line in scored.stdout.splitlines()] == [1.0, 0.0]


def test_a_run_trains_with_it_through_plugins_and_reward(scaffold, tmp_path):
    _, target = scaffold
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--plugins", f"{EMBEDDED},{NAME}", "--reward", NAME, *SHORT_RUN,
                       "--run-dir", str(run_dir), env={"PYTHONPATH": str(target)})
    assert proc.returncode == 0, proc.stderr
    assert all(f"rollout/reward/{NAME}" in step for step in read_metrics(run_dir))
    lock = json.loads((run_dir / "plugins.lock.json").read_text())
    entry = next(entry for entry in lock if entry["name"] == NAME)
    assert (entry["distribution"], entry["version"], entry["target"]) == (
        f"rl-plugin-{NAME}", "0.1.0", "plasmid_contains_label.plugin")
