"""Plugin selection and every plugin error, end to end through the CLI in a subprocess.

Broken fixture packages are installed into a private directory that only these subprocesses
see (PYTHONPATH), so they never leak into the test environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from faulty_plugins import ALL, install_faulty
from plasmid_e2e import SHORT_RUN, read_metrics, run_plasmid


def _json(proc):
    assert proc.returncode == 0, proc.stderr
    return {entry["name"]: entry for entry in json.loads(proc.stdout)}


def assert_clean_error(proc, *fragments):
    """Exit code 2, one message naming each fragment, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} not in:\n{proc.stderr}"


def test_plugins_lists_the_embedded_plugins_with_their_providers():
    plugins = _json(run_plasmid("plugins", "--json"))
    assert plugins["grpo"]["distribution"] == "plasmid-grpo"
    assert plugins["grpo"]["status"] == "loaded"
    assert "grpo" in plugins["grpo"]["providers"]["loss"]
    assert "exact" in plugins["match"]["providers"]["reward"]
    assert plugins["plasmid.builtin"]["status"] == "kernel"


def test_plugins_show_lists_providers_and_options():
    proc = run_plasmid("plugins", "show", "rollout")
    assert proc.returncode == 0, proc.stderr
    assert "rollout: rollout" in proc.stdout and "--rollout-max-launch-factor" in proc.stdout


def test_plugins_selection_excludes_with_no_prefix():
    plugins = _json(run_plasmid("plugins", "--json", "--plugins", "no:dynamic"))
    assert plugins["dynamic"]["status"] == "excluded"
    assert plugins["grpo"]["status"] == "loaded"


def test_environment_variable_selects_and_the_flag_wins():
    plugins = _json(run_plasmid("plugins", "--json", env={"PLASMID_PLUGINS": "grpo"}))
    assert plugins["grpo"]["status"] == "loaded" and plugins["match"]["status"] == "excluded"
    plugins = _json(run_plasmid("plugins", "--json", "--plugins", "match", env={"PLASMID_PLUGINS": "grpo"}))
    assert plugins["grpo"]["status"] == "excluded" and plugins["match"]["status"] == "loaded"
    plugins = _json(run_plasmid("plugins", "--json", env={"PLASMID_PLUGINS": ""}))
    assert all(p["status"] in ("excluded", "kernel") for p in plugins.values())


def test_unknown_plugin_name_suggests_the_closest():
    assert_clean_error(run_plasmid("train", "--plugins", "grop"), "unknown plugin 'grop'", "did you mean 'grpo'")


def test_unknown_provider_name_suggests_the_closest():
    assert_clean_error(run_plasmid("train", "--reward", "exakt"), "unknown reward 'exakt'", "did you mean 'exact'")


def test_selected_plugin_that_fails_to_import_stops_with_its_package(broken_plugins):
    proc = run_plasmid("train", "--plugins", "broken", env={"PYTHONPATH": str(broken_plugins)})
    assert_clean_error(proc, "'broken' (distribution rl-plugin-broken 0.1.0)", "ModuleNotFoundError",
                       "--plugins no:broken")


def test_debug_shows_the_traceback(broken_plugins):
    proc = run_plasmid("train", "--plugins", "broken", "--debug", env={"PYTHONPATH": str(broken_plugins)})
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_autoloaded_broken_and_incompatible_plugins_are_skipped_and_listed(broken_plugins):
    env = {"PYTHONPATH": str(broken_plugins)}
    plugins = _json(run_plasmid("plugins", "--json", env=env))
    assert plugins["broken"]["status"] == "skipped" and "ModuleNotFoundError" in plugins["broken"]["reason"]
    assert plugins["oldapi"]["status"] == "skipped" and "requires plasmid<10,>=9" in plugins["oldapi"]["reason"]
    assert plugins["badhook"]["status"] == "skipped" and "plasmid_reward" in plugins["badhook"]["reason"]
    assert plugins["grpo"]["status"] == "loaded"


def test_autoloaded_broken_plugin_warns_and_the_run_continues(broken_plugins, tmp_path):
    proc = run_plasmid("train", "--plugins", "no:badhook", *SHORT_RUN, "--num-rollouts", "1",
                       "--run-dir", str(tmp_path / "run"), env={"PYTHONPATH": str(broken_plugins)})
    assert proc.returncode == 0, proc.stderr
    assert "skipping plugin 'broken' (distribution rl-plugin-broken 0.1.0)" in proc.stderr
    assert "skipping plugin 'oldapi'" in proc.stderr
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


def test_incompatible_plugin_is_refused_from_metadata_before_import(broken_plugins):
    proc = run_plasmid("train", "--plugins", "oldapi", env={"PYTHONPATH": str(broken_plugins)})
    assert_clean_error(proc, "'oldapi' (distribution rl-plugin-oldapi 0.1.0)", "requires plasmid<10,>=9",
                       "plasmid 0.1.0 is installed")
    probe = ("import warnings, sys; warnings.simplefilter('ignore')\n"
             "from plasmid.startup import load_plugins\nload_plugins('no:badhook')\n"
             "print('rl_plugin_oldapi' in sys.modules)")
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(broken_plugins)})
    assert out.stdout.strip() == "False", out.stderr


def test_misspelled_hook_is_an_error_at_startup(broken_plugins):
    proc = run_plasmid("train", "--plugins", "badhook", env={"PYTHONPATH": str(broken_plugins)})
    assert_clean_error(proc, "rl-plugin-badhook", "plasmid_reward", "does not define")


def test_hookimpl_with_wrong_arguments_is_an_error_at_startup(tmp_path):
    local = tmp_path / "wrong_args.py"
    local.write_text("from plasmid import hookimpl\n\n@hookimpl\ndef plasmid_rewards(register, bogus):\n    pass\n")
    assert_clean_error(run_plasmid("train", "--plugins", str(local)), "wrong_args", "bogus")


def test_two_plugins_registering_one_name_are_both_named(tmp_path):
    local = tmp_path / "dup_exact.py"
    local.write_text("from plasmid import hookimpl\n\n@hookimpl\ndef plasmid_rewards(register):\n"
                     "    register('exact', 'builtins:len')\n")
    proc = run_plasmid("train", "--plugins", str(local))
    assert_clean_error(proc, "reward 'exact' is registered by two plugins", "plasmid-match", "dup_exact")


def test_two_providers_for_a_one_provider_family_without_a_choice(tmp_path):
    local = tmp_path / "other_source.py"
    local.write_text("from plasmid import hookimpl\n\n@hookimpl\ndef plasmid_datasources(register):\n"
                     "    register('other', 'builtins:dict')\n")
    proc = run_plasmid("train", "--plugins", f"hf,jsonl,torchgen,rollout,torchtrain,grpo,sync,match,{local}")
    assert_clean_error(proc, "2 datasource providers are loaded and none was chosen", "'jsonl' from 'jsonl' "
                       "(distribution plasmid-jsonl", "'other' from 'other_source' (local module", "--datasource NAME")


def test_plugins_check_imports_each_in_a_subprocess(broken_plugins):
    proc = run_plasmid("plugins", "check", "--json", env={"PYTHONPATH": str(broken_plugins)})
    assert proc.returncode == 1
    results = {r["name"]: r for r in json.loads(proc.stdout)}
    assert not results["broken"]["ok"] and "a_module_that_does_not_exist" in results["broken"]["error"]
    assert not results["oldapi"]["ok"] and "requires plasmid" in results["oldapi"]["error"]
    assert results["grpo"]["ok"] and results["grpo"]["import_seconds"] >= 0


# ------------------------------------------------------------------ rl-plugin-faulty (faulty_plugins.py)
@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """The environment of a subprocess in which rl-plugin-faulty is installed."""
    return {"PYTHONPATH": str(install_faulty(tmp_path_factory.mktemp("faulty")))}


def _score(*args, env):
    """``plasmid score ARGS`` scoring the response "a b" against the label "a b"."""
    return subprocess.run([sys.executable, "-m", "plasmid.app.cli", "score", "--label", "a b", *args], input="a b\n",
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                          timeout=300)


def _only(name):
    return ",".join(f"no:{other}" for other in ALL if other != name)


@pytest.mark.parametrize("name", ALL)
def test_an_autoloaded_broken_plugin_is_skipped_with_a_warning_line_naming_its_package(name, faulty):
    proc = _score("--reward", "f1", "--plugins", _only(name), env=faulty)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["reward"] == 1.0
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("plasmid score: ")]  # its summary
    assert 1 <= len(lines) <= 2, proc.stderr  # faultylazy has two bad targets
    for line in lines:
        assert line.startswith("plasmid: warning: skipping "), line
        assert f"of plugin '{name}'" in line or f"plugin '{name}'" in line
        assert "(distribution rl-plugin-faulty 0.3.0)" in line and "--plugins no:" in line


@pytest.mark.parametrize("name", ALL)
def test_a_selected_broken_plugin_stops_with_one_line(name, faulty):
    proc = _score("--reward", "f1", "--plugins", f"{name},match", env=faulty)
    assert_clean_error(proc, f"'{name}' (distribution rl-plugin-faulty 0.3.0)", "--plugins no:")
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("plasmid: error: "), proc.stderr


def test_a_run_with_every_broken_plugin_installed_trains_and_warns_once_each(faulty, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--reward", "f1", *SHORT_RUN, "--num-rollouts", "1", "--run-dir", str(run_dir),
                       env=faulty)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: warning: ")]
    assert len(warnings) == len(set(warnings)) == 7, proc.stderr  # 4 plugins, 2 lazy targets, 1 collision
    assert all(line.startswith("plasmid: warning: skipping ") and "rl-plugin-faulty 0.3.0" in line
               for line in warnings)
    assert "UserWarning" not in proc.stderr and "warnings.warn" not in proc.stderr
    assert all("rollout/reward/f1" in m for m in read_metrics(run_dir))
    lock = {entry["name"] for entry in json.loads((run_dir / "plugins.lock.json").read_text())}
    assert {"faultyexact", "faultylazy"} <= lock and not {"faultyimport", "faultysig", "faultyhook"} & lock
