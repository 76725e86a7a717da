"""A third-party plugin package, installed with pip, is discovered, listed, selected, excluded,
and its reward is the one a run uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from plasmid_e2e import FIXTURES, SHORT_RUN, pip, read_metrics, run_plasmid

EMBEDDED = "hf,tasks,torchgen,rollout,torchtrain,grpo,sync"


@pytest.fixture(scope="module", autouse=True)
def xyz_installed():
    """rl-plugin-xyz built and pip-installed into this test environment, removed afterwards."""
    pip("install", "--no-deps", str(FIXTURES / "rl-plugin-xyz"))
    yield
    pip("uninstall", "-y", "rl-plugin-xyz")


def _plugins(*args):
    proc = run_plasmid("plugins", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return {p["name"]: p for p in json.loads(proc.stdout)}


def test_installed_package_is_discovered_and_listed():
    xyz = _plugins()["xyz"]
    assert (xyz["distribution"], xyz["version"], xyz["status"]) == ("rl-plugin-xyz", "0.1.0", "loaded")
    assert xyz["providers"] == {"reward": ["xyz"], "datasource": ["xyz-data"]}


def test_it_can_be_excluded_and_selected():
    assert _plugins("--plugins", "no:xyz")["xyz"]["status"] == "excluded"
    selected = _plugins("--plugins", "xyz,grpo")
    assert selected["xyz"]["status"] == "loaded" and selected["match"]["status"] == "excluded"


def test_the_installed_package_passes_its_own_contract_tests():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
                           str(FIXTURES / "rl-plugin-xyz" / "tests")], capture_output=True, text=True,
                          cwd=FIXTURES / "rl-plugin-xyz", env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " passed" in proc.stdout


def test_its_reward_is_the_one_used(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--plugins", f"{EMBEDDED},xyz", "--reward", "xyz", *SHORT_RUN,
                       "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    metrics = read_metrics(run_dir)
    assert all("rollout/reward/xyz" in m for m in metrics)
    assert not any("rollout/reward/exact" in m for m in metrics)
    lock = {entry["name"]: entry for entry in json.loads((run_dir / "plugins.lock.json").read_text())}
    assert {key: lock["xyz"][key] for key in ("distribution", "version", "target", "providers")} == {
        "distribution": "rl-plugin-xyz", "version": "0.1.0", "target": "rl_plugin_xyz.plugin",
        "providers": {"reward": ["xyz"]}}
    assert "match" not in lock
