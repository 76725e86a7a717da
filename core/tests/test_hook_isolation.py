"""Every hook call is isolated (plasmid.plugins): a plugin whose bootstrap hook raises follows the
broken-plugin policy (auto-loaded: skipped with one warning line; selected: a one-line error), a
plugin whose observer hook raises is warned about once and switched off (or, with
``--observer-errors fail``, remembered for the loop to stop on), and a misspelled or mis-declared
hook is reported with the hook meant and its signature. Uses rl-plugin-hookfaults
(tests/faulty_plugins.py), a real distribution installed into a directory put on sys.path."""

from __future__ import annotations

import importlib
import re

import pytest
from faulty_plugins import BOOTSTRAP_FAULTS, HOOK_FAULTS, OBSERVER_FAULTS, install_hook_faults

from plasmid.errors import PluginError, UsageError
from plasmid.startup import start

# the runs score with plasmid-match's f1 (the kernel env has no reward)
pytest.importorskip("plasmid_match", reason="needs plasmid-match installed (the embedded env runs these)")

PACKAGE = "(distribution rl-plugin-hookfaults 0.1.0)"
HOOK_OF = {"badaddoption": "plasmid_addoption", "baddefaults": "plasmid_defaults",
           "badconfigure": "plasmid_configure"}
ERROR_OF = {"badaddoption": "RuntimeError: faulty addoption", "baddefaults": "KeyError: 'faulty defaults'",
            "badconfigure": "ValueError: faulty configure"}
REWARD_OF = {"badaddoption": "bad-addoption", "baddefaults": "bad-defaults", "badconfigure": "bad-configure"}


@pytest.fixture(scope="session")
def hook_faults_dir(tmp_path_factory):
    return install_hook_faults(tmp_path_factory.mktemp("hookfaults"))


@pytest.fixture(autouse=True)
def hook_faults_installed(hook_faults_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(hook_faults_dir))
    importlib.invalidate_caches()


def only(*names):
    """A selection that auto-loads everything installed but the faulty plugins not in ``names``."""
    return ",".join(f"no:{name}" for name in HOOK_FAULTS if name not in names)


def score_start(*argv):
    """Start-up as ``plasmid score`` runs it (rewards only), scoring with plasmid-match's f1."""
    return start(["--reward", "f1", "--run-dir", "unused", *argv], rewards_only=True)


def warning_lines(capsys):
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("plasmid: warning: ") for line in lines), lines
    return lines


@pytest.mark.parametrize("name", BOOTSTRAP_FAULTS)
def test_an_autoloaded_plugin_failing_in_a_bootstrap_hook_is_skipped_with_one_warning_line(name, capsys):
    startup = score_start("--plugins", only(name))
    [line] = warning_lines(capsys)
    assert line.startswith(f"plasmid: warning: skipping plugin '{name}' {PACKAGE}: failed in {HOOK_OF[name]}: "
                           f"{ERROR_OF[name]}; "), line
    assert f"--plugins no:{name}" in line and "force-reinstall" not in line
    info = startup.manager.infos[name]
    assert info.status == "skipped" and HOOK_OF[name] in info.reason
    assert not startup.manager.pm.has_plugin(name)
    assert name not in {entry["name"] for entry in startup.config.plugin_lock}
    with pytest.raises(PluginError, match=f"reward '{REWARD_OF[name]}' .*skipped at start-up: plugin '{name}' "
                                          f"{re.escape(PACKAGE)} failed in {HOOK_OF[name]}"):
        startup.registry.get("reward", REWARD_OF[name])
    # what the plugin did before it raised is undone: its option is not declared, its default not set
    assert not hasattr(startup.config.option, "badaddoption_level")
    assert startup.config.option.seed == 0
    assert startup.registry.get("reward", "f1").plugin.name == "match"


def test_a_skipped_plugins_options_do_not_break_parsing(capsys):
    with pytest.raises(UsageError, match="unknown option --badaddoption-level"):
        score_start("--plugins", only("badaddoption"), "--badaddoption-level", "2")
    startup = score_start("--plugins", only("badaddoption"), "--seed", "3")
    assert startup.config.option.seed == 3


@pytest.mark.parametrize("name", BOOTSTRAP_FAULTS)
def test_a_selected_plugin_failing_in_a_bootstrap_hook_stops_the_startup_with_one_line(name, capsys):
    with pytest.raises(PluginError) as error:
        score_start("--plugins", f"{name},match")
    message = str(error.value)
    assert message.startswith(f"plugin '{name}' {PACKAGE} failed in {HOOK_OF[name]}: {ERROR_OF[name]}; "), message
    assert "\n" not in message and f"--plugins no:{name}" in message
    assert capsys.readouterr().err == ""


def test_a_run_that_chose_the_provider_of_a_plugin_skipped_in_configure_names_why(capsys):
    with pytest.raises(PluginError, match=f"reward 'bad-configure' .*skipped at start-up: plugin 'badconfigure' "
                                          f"{re.escape(PACKAGE)} failed in plasmid_configure: ValueError: faulty "
                                          f"configure"):
        start(["--reward", "bad-configure", "--plugins", only("badconfigure")], rewards_only=True)


def test_an_observer_that_raises_is_warned_about_once_and_switched_off(tmp_path, capsys):
    manager = score_start("--plugins", only(*OBSERVER_FAULTS)).manager
    capsys.readouterr()
    for step in range(3):
        manager.metrics(step, {"rollout/reward_mean": 1.0})
        manager.step_end(step, str(tmp_path), {"step": step})
    lines = warning_lines(capsys)
    assert len(lines) == 2, lines   # badmetrics and badstepend, once each
    metrics_line = next(line for line in lines if "'badmetrics'" in line)
    assert (f"plugin 'badmetrics' {PACKAGE} failed in plasmid_metrics: RuntimeError: faulty metrics; its observer "
            f"hooks are off for the rest of the run") in metrics_line
    assert "--observer-errors fail" in metrics_line
    assert any("failed in plasmid_step_end: RuntimeError: faulty step_end" in line for line in lines)
    # badmetrics' own step_end is switched off with it: it would have written this file
    assert not (tmp_path / "badmetrics_step_end").exists()
    assert manager.observer_failure == ""


def test_with_observer_errors_fail_the_first_failure_is_kept_for_the_loop(tmp_path, capsys):
    manager = score_start("--plugins", only(*OBSERVER_FAULTS), "--observer-errors", "fail").manager
    capsys.readouterr()
    manager.weights_synced(0, None)
    manager.metrics(0, {})
    assert manager.observer_failure == (f"plugin 'badsynced' {PACKAGE} failed in plasmid_weights_synced: "
                                        f"RuntimeError: faulty weights_synced")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("name", "written", "meant", "signature"), [
    ("typometric", "plasmid_metric", "plasmid_metrics", "plasmid_metrics(step: int, metrics: dict[str, float])"),
    ("typoaddoption", "plasmid_add_option", "plasmid_addoption", "plasmid_addoption(parser: OptionParser)"),
])
def test_a_misspelled_hook_gets_a_did_you_mean_with_the_hooks_signature(name, written, meant, signature, capsys):
    startup = score_start("--plugins", only(name))
    [line] = warning_lines(capsys)
    assert f"skipping plugin '{name}' {PACKAGE}: implements {written}, a hook plasmid does not define" in line
    assert f"did you mean {meant}? It is {signature}" in line, line
    assert "force-reinstall" not in line and f"--plugins no:{name}" in line
    assert startup.manager.infos[name].status == "skipped"
    with pytest.raises(PluginError, match=f"did you mean {meant}"):
        score_start("--plugins", f"{name},match")
