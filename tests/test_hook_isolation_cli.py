"""Isolation of every hook call, end to end through the CLI in a subprocess, with
rl-plugin-hookfaults (faulty_plugins.py) installed into a directory only these subprocesses see:

- a plugin failing in a bootstrap hook: auto-loaded, skipped with one warning line and the command
  goes on; selected, one error line, exit 2, nothing written;
- an observer failing: one warning per plugin, its observers off, the run goes on; with
  ``--observer-errors fail`` the run stops (exit 2, one line) with a checkpoint of the step, and a
  failing ``plasmid_run_start`` leaves no run behind;
- ``plasmid plugins check`` reports bootstrap failures; ``plasmid plugins`` lists with every broken
  plugin installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from faulty_plugins import BOOTSTRAP_FAULTS, HOOK_FAULTS, OBSERVER_FAULTS, install_faulty, install_hook_faults
from plasmid_e2e import SHORT_RUN, read_metrics, run_plasmid

PACKAGE = "(distribution rl-plugin-hookfaults 0.1.0)"
#: what a default (quickstart) training run uses
QUICKSTART = "tasks,hf,torchgen,rollout,match,grpo,torchtrain,sync"
HOOK_OF = {"badaddoption": "plasmid_addoption", "baddefaults": "plasmid_defaults",
           "badconfigure": "plasmid_configure", "badmetrics": "plasmid_metrics", "badstepend": "plasmid_step_end",
           "badsynced": "plasmid_weights_synced", "badrunstart": "plasmid_run_start"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of a subprocess in which rl-plugin-hookfaults is installed."""
    return {"PYTHONPATH": str(install_hook_faults(tmp_path_factory.mktemp("hookfaults")))}


def only(*names):
    """A selection that auto-loads everything installed but the hook faults not in ``names``."""
    return ",".join(f"no:{name}" for name in HOOK_FAULTS if name not in names)


def score(*args, env):
    """``plasmid score ARGS`` scoring the response "a b" against the label "a b" with f1."""
    return subprocess.run([sys.executable, "-m", "plasmid.app.cli", "score", "--label", "a b", "--reward", "f1",
                           *args], input="a b\n", capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env}, timeout=300)


def warnings_of(proc):
    return [line for line in proc.stderr.splitlines() if line.startswith("plasmid: warning: ")]


def assert_one_error_line(proc, *fragments):
    """Exit 2, no traceback, and one ``plasmid: error:`` line holding every fragment."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: error: ")]
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


# ---------------------------------------------------------------------------- bootstrap hooks
def test_autoloaded_plugins_failing_in_bootstrap_hooks_are_skipped_and_the_command_goes_on(env):
    proc = score("--plugins", only(*BOOTSTRAP_FAULTS), env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["reward"] == 1.0
    lines = warnings_of(proc)
    assert len(lines) == 3 and "Traceback" not in proc.stderr, proc.stderr
    for name in BOOTSTRAP_FAULTS:
        [line] = [line for line in lines if f"'{name}'" in line]
        assert f"skipping plugin '{name}' {PACKAGE}: failed in {HOOK_OF[name]}: " in line
        assert "force-reinstall" not in line and f"--plugins no:{name}" in line


@pytest.mark.parametrize("name", BOOTSTRAP_FAULTS)
def test_a_selected_plugin_failing_in_a_bootstrap_hook_stops_train_before_anything_is_written(name, env, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--plugins", f"{name},{QUICKSTART}", "--run-dir", str(run_dir), env=env)
    assert_one_error_line(proc, f"plugin '{name}' {PACKAGE} failed in {HOOK_OF[name]}: ", f"--plugins no:{name}")
    assert not run_dir.exists()


def test_plugins_check_reports_bootstrap_failures_and_misspelled_hooks(env):
    selection = ",".join([*BOOTSTRAP_FAULTS, "typometric", "typoaddoption", "match"])
    proc = run_plasmid("plugins", "check", "--json", "--plugins", selection, env=env)
    assert proc.returncode == 1, proc.stderr
    problems = {r["name"]: " | ".join(r["problems"]) for r in json.loads(proc.stdout)}
    for name in BOOTSTRAP_FAULTS:
        assert f"failed in {HOOK_OF[name]}" in problems[name], problems[name]
    assert "did you mean plasmid_metrics? It is plasmid_metrics(step: int" in problems["typometric"]
    assert "did you mean plasmid_addoption?" in problems["typoaddoption"]
    assert problems["match"] == ""


def test_plugins_lists_and_shows_with_every_broken_plugin_installed(env, tmp_path):
    both = {"PYTHONPATH": f"{env['PYTHONPATH']}:{install_faulty(tmp_path / 'faulty')}"}
    proc = run_plasmid("plugins", "--json", env=both)
    assert proc.returncode == 0, proc.stderr
    plugins = {entry["name"]: entry for entry in json.loads(proc.stdout)}
    assert plugins["badaddoption"]["status"] == "skipped"
    assert "failed in plasmid_addoption" in plugins["badaddoption"]["reason"]
    assert plugins["faultyimport"]["status"] == "skipped" and plugins["match"]["status"] == "loaded"
    shown = run_plasmid("plugins", "show", "badaddoption", env=both)
    assert shown.returncode == 0 and "failed in plasmid_addoption" in shown.stdout, shown.stderr
    listed = run_plasmid("plugins", env=both)
    assert listed.returncode == 0 and "badmetrics" in listed.stdout, listed.stderr


# ---------------------------------------------------------------------------- observer hooks
def test_failing_observers_are_warned_about_once_each_and_the_run_goes_on(env, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", *SHORT_RUN, "--plugins", only(*OBSERVER_FAULTS), "--run-dir", str(run_dir),
                       env=env)
    assert proc.returncode == 0, proc.stderr
    lines = warnings_of(proc)
    assert len(lines) == len(set(lines)) == 4, proc.stderr   # once per plugin, not per step
    for name in OBSERVER_FAULTS:
        [line] = [line for line in lines if f"'{name}'" in line]
        assert f"plugin '{name}' {PACKAGE} failed in {HOOK_OF[name]}: " in line
        assert "its observer hooks are off for the rest of the run" in line
    assert [entry["step"] for entry in read_metrics(run_dir)] == [0, 1]
    assert not (run_dir / "badmetrics_step_end").exists()   # switched off with its plasmid_metrics
    assert (run_dir / "config.json").is_file()


def test_with_observer_errors_fail_a_failing_observer_stops_the_run_with_a_checkpoint_of_the_step(env, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", *SHORT_RUN, "--observer-errors", "fail", "--plugins", only("badmetrics"),
                       "--run-dir", str(run_dir), env=env)
    line = assert_one_error_line(proc, f"plugin 'badmetrics' {PACKAGE} failed in plasmid_metrics: RuntimeError: "
                                       f"faulty metrics; checkpoint ", "step_000000 written (continue with --resume)")
    assert [entry["step"] for entry in read_metrics(run_dir)] == [0]   # the step's metrics are kept
    assert (run_dir / "checkpoints" / "step_000000").is_dir(), line
    assert not warnings_of(proc)


def test_with_observer_errors_fail_a_failing_run_start_leaves_no_run_behind(env, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", *SHORT_RUN, "--observer-errors", "fail", "--plugins", only("badrunstart"),
                       "--run-dir", str(run_dir), env=env)
    assert_one_error_line(proc, f"plugin 'badrunstart' {PACKAGE} failed in plasmid_run_start: OSError: faulty "
                                f"run_start; what the start-up wrote is removed")
    assert not run_dir.exists()


def test_a_bad_observer_errors_value_is_one_line_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--observer-errors", "maybe", "--run-dir", str(run_dir))
    assert_one_error_line(proc, "--observer-errors", "'maybe'")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not run_dir.exists()
