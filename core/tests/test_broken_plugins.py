"""One policy for every broken plugin (plasmid.plugins): an auto-loaded one is skipped with one
warning line naming its distribution and the fix; a selected one stops the start-up with the
same text. Uses rl-plugin-faulty (tests/faulty_plugins.py), a real distribution installed into
a directory put on sys.path."""

from __future__ import annotations

import importlib

import pytest
from faulty_plugins import ALL, install_faulty

from plasmid.errors import PluginError
from plasmid.plugins import PluginManager, Selection, installed_entry_points
from plasmid.registry import Registry

# the faulty rewards collide with, and the runs select, plasmid-match's rewards (the kernel env has none)
pytest.importorskip("plasmid_match", reason="needs plasmid-match installed (the embedded env runs these)")

PACKAGE = "(distribution rl-plugin-faulty 0.3.0)"


@pytest.fixture(scope="session")
def faulty_dir(tmp_path_factory):
    return install_faulty(tmp_path_factory.mktemp("faulty"))


@pytest.fixture(autouse=True)
def faulty_installed(faulty_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(faulty_dir))
    importlib.invalidate_caches()


def only(*names, extra=""):
    """A selection that auto-loads everything installed but the faulty plugins not in ``names``."""
    return ",".join(f"no:{name}" for name in ALL if name not in names) + extra


def start(spec):
    manager = PluginManager()
    manager.load(Selection.parse(spec, installed_entry_points()))
    return manager, Registry.collect(manager)


def warning_lines(capsys):
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("plasmid: warning: ") for line in lines), lines
    return lines


def test_third_party_provider_named_like_a_first_party_one_keeps_only_its_other_providers(capsys):
    manager, registry = start(only("faultyexact"))
    assert registry.get("reward", "exact").plugin.name == "match"
    assert registry.get("reward", "faulty-extra").plugin.name == "faultyexact"
    assert registry.get("reward", "f1").plugin.name == "match"
    assert manager.infos["faultyexact"].status == "loaded"
    [line] = warning_lines(capsys)
    assert f"skipping reward 'exact' of plugin 'faultyexact' {PACKAGE}" in line
    assert "'match' (distribution plasmid-match" in line and "--plugins no:match" in line
    assert "faultyexact" in {entry["name"] for entry in manager.lock()}


@pytest.mark.parametrize(("name", "fragment"), [
    ("faultyimport", "failed to import faulty_import: ModuleNotFoundError"),
    ("faultysig", "bogus"),
    ("faultyhook", "plasmid_reward"),
    ("faultyraise", "failed in plasmid_rewards: RuntimeError: faulty registration"),
])
def test_an_autoloaded_broken_plugin_is_skipped_with_one_warning_line(name, fragment, capsys):
    manager, registry = start(only(name))
    info = manager.infos[name]
    assert info.status == "skipped" and fragment in info.reason
    [line] = warning_lines(capsys)
    assert f"skipping plugin '{name}' {PACKAGE}" in line and fragment in line
    # reinstalling can mend a broken install (a missing module), never a plugin's own code
    assert ("pip install --force-reinstall rl-plugin-faulty" in line) == (name == "faultyimport"), line
    assert f"--plugins no:{name}" in line
    assert not manager.pm.has_plugin(name)
    assert name not in {entry["name"] for entry in manager.lock()}
    assert not any(provider.plugin is info for family in registry.providers.values() for provider in family.values())
    assert registry.get("reward", "f1").plugin.name == "match"


def test_a_hook_with_an_argument_its_hookspec_lacks_is_shown_with_the_expected_signature(capsys):
    start(only("faultysig"))
    [line] = warning_lines(capsys)
    assert ("has an invalid hook implementation: plasmid_rewards(register, bogus) takes 'bogus', which the hook "
            "does not pass; the hook is plasmid_rewards(register: Register)") in line, line
    assert "report it to the authors of rl-plugin-faulty" in line


def test_a_registration_hook_that_raises_drops_what_the_plugin_registered_before():
    _, registry = start(only("faultyraise"))
    assert "faulty-filter" not in registry.names("filter")


def test_lazy_targets_that_do_not_exist_are_skipped_and_the_plugin_kept(capsys):
    manager, registry = start(only("faultylazy"))
    assert manager.infos["faultylazy"].status == "loaded"
    assert registry.get("reward", "faulty-lazy-ok").load().__name__ == "AlwaysOne"
    ghost, noattr = warning_lines(capsys)
    assert f"skipping reward 'faulty-ghost' of plugin 'faultylazy' {PACKAGE}" in ghost
    assert "no module named 'faulty_no_such_module'" in ghost
    assert "faulty-noattr" in noattr and "no attribute 'NoSuchReward'" in noattr
    with pytest.raises(PluginError, match="reward 'faulty-ghost' .*skipped at start-up.*faulty_no_such_module"):
        registry.get("reward", "faulty-ghost")
    assert len(manager.infos["faultylazy"].problems) == 2


def test_lazy_target_check_imports_nothing(tmp_path, monkeypatch):
    from plasmid.registry import missing_target

    package = tmp_path / "lazy_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "mod.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert missing_target("lazy_probe_pkg.mod:Thing") == ""
    assert missing_target("lazy_probe_pkg.nope:Thing") == "no module named 'lazy_probe_pkg.nope'"
    assert missing_target("plasmid_torch.disk_sync:DiskSync") == ""


@pytest.mark.parametrize(("name", "fragment"), [
    ("faultyimport", "failed to import faulty_import: ModuleNotFoundError"),
    ("faultysig", "bogus"),
    ("faultyhook", "plasmid_reward"),
    ("faultyraise", "faulty registration"),
    ("faultylazy", "reward 'faulty-ghost' of plugin 'faultylazy'"),
    ("faultyexact", "reward 'exact' is registered by two plugins"),
])
def test_a_selected_broken_plugin_stops_the_startup_with_the_same_message(name, fragment, capsys):
    with pytest.raises(PluginError) as error:
        start(f"{name},match")
    message = str(error.value)
    assert "\n" not in message and fragment in message
    assert PACKAGE in message and f"--plugins no:{name}" in message
    assert capsys.readouterr().err == ""


def test_every_fault_at_once_still_loads_the_rest_and_warns_once_each(capsys):
    manager, registry = start(None)
    lines = warning_lines(capsys)
    assert len(lines) == len(set(lines)) == 7  # four skipped plugins, two lazy targets, one collision
    Registry.collect(manager)
    assert warning_lines(capsys) == []  # the same warnings are not given twice
    assert registry.get("reward", "exact").plugin.name == "match"


def test_listing_records_every_problem_without_warning(capsys):
    manager = PluginManager()
    manager.load(Selection.parse(None, installed_entry_points()), tolerant=True)
    Registry.collect(manager, tolerant=True)
    assert capsys.readouterr().err == ""
    for name in ("faultyimport", "faultysig", "faultyhook", "faultyraise"):
        assert manager.infos[name].status == "skipped", name
    assert any("faulty-ghost" in line for line in manager.infos["faultylazy"].problems)
    assert any("'exact'" in line for line in manager.infos["faultyexact"].problems)


def test_a_lock_resolves_collisions_as_the_driver_did_silently(capsys):
    driver, _ = start(only("faultyexact"))
    capsys.readouterr()
    worker = PluginManager()
    worker.load_lock(driver.lock())
    registry = Registry.collect(worker)
    assert registry.get("reward", "exact").plugin.name == "match"
    assert "faulty-extra" in registry.names("reward")
    assert capsys.readouterr().err == ""
