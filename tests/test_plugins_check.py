"""``plasmid plugins check`` validates installed plugins without training: requirement, import,
hook names and arguments, registration, lazy targets, provider-name collisions; exit 1 on any
problem. rl-plugin-faulty (faulty_plugins.py) is installed into a directory only these
subprocesses see."""

from __future__ import annotations

import json

import pytest
from faulty_plugins import ALL, install_faulty
from plasmid_e2e import run_plasmid

SELECTION = ",".join([*ALL, "match", "grpo"])


@pytest.fixture(scope="module")
def env(tmp_path_factory, broken_plugins):
    faulty = install_faulty(tmp_path_factory.mktemp("faulty"))
    return {"PYTHONPATH": f"{faulty}:{broken_plugins}"}


def test_every_problem_is_found_and_exits_1(env):
    proc = run_plasmid("plugins", "check", "--json", "--plugins", f"{SELECTION},oldapi,badhook", env=env)
    assert proc.returncode == 1, proc.stderr
    results = {r["name"]: r for r in json.loads(proc.stdout)}
    problems = {name: " | ".join(r["problems"]) for name, r in results.items()}
    assert "ModuleNotFoundError" in problems["faultyimport"]
    assert "bogus" in problems["faultysig"] and "invalid hook implementation" in problems["faultysig"]
    assert "plasmid_reward" in problems["faultyhook"] and "does not define" in problems["faultyhook"]
    assert "faulty registration" in problems["faultyraise"]
    lazy = results["faultylazy"]["problems"]
    assert len(lazy) == 2 and "faulty_no_such_module" in lazy[0] and "NoSuchReward" in lazy[1]
    [collision] = results["faultyexact"]["problems"]
    assert "reward 'exact'" in collision and "'match' (distribution plasmid-match" in collision
    assert "requires plasmid<10,>=9" in problems["oldapi"]
    assert "plasmid_reward" in problems["badhook"]
    for name in ("match", "grpo"):
        assert results[name]["ok"] and results[name]["problems"] == [] and results[name]["import_seconds"] >= 0
    assert ["reward", "exact"] in results["match"]["providers"]
    assert results["faultyexact"]["error"] == collision


def test_human_output_is_one_line_per_problem(env):
    proc = run_plasmid("plugins", "check", "--plugins", SELECTION, env=env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "plasmid plugins check: 8 plugins checked, 7 problems"
    problems = lines[:-1]
    assert len(problems) == 7
    assert all(line.startswith("faulty") and "(rl-plugin-faulty 0.3.0): " in line for line in problems)


def test_no_problem_exits_0(env):
    proc = run_plasmid("plugins", "check", "--plugins", "match,grpo", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == ["plasmid plugins check: 2 plugins checked, 0 problems"]


def test_an_unknown_plugin_in_the_selection_is_a_usage_error(env):
    proc = run_plasmid("plugins", "check", "--plugins", "faultyimprot", env=env)
    assert proc.returncode == 2 and "did you mean 'faultyimport'" in proc.stderr
