"""docs/options.md is what ``python -m plasmid.app.docs_options`` writes for the embedded plugin set
(the plugins of requirements/embedded.txt: every option of the kernel and of hf, tasks, jsonl,
torchgen, agent, multiturn, rollout, match, math, code, remote, dynamic, grpo, ppo, reinforce-pp,
torchtrain, sync, tools, sft and opd); any option, default, help or provider that changes in the
code without the page being regenerated fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from plasmid.app.docs_options import COMMAND, main, markdown, render
from plasmid.errors import PluginError

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "options.md"


def embedded_plugins() -> str:
    """The entry-point names of the plugin packages in requirements/embedded.txt, in its order."""
    names = []
    for line in (ROOT / "requirements" / "embedded.txt").read_text().splitlines():
        match = re.match(r"-e \./(plugins/\S+)", line)
        if match:
            project = tomllib.loads((ROOT / match.group(1) / "pyproject.toml").read_text())["project"]
            names += list(project["entry-points"].get("plasmid", {}))   # plasmid-scaffold: commands only
    return ",".join(names)


@pytest.fixture(scope="module")
def generated() -> str:
    return render(embedded_plugins())


def test_docs_options_md_is_up_to_date(generated):
    assert PAGE.read_text() == generated, (
        f"docs/options.md is out of date; regenerate it: {COMMAND.format(plugins=embedded_plugins())}")


def test_it_covers_every_embedded_plugin_and_its_options(generated):
    covered = next(line for line in generated.splitlines() if line.startswith("Plugins covered: "))
    for name in embedded_plugins().split(","):
        assert f"`{name}`" in covered and f"\n## {name}\n" in generated, name
    assert "| `--num-rollouts` | `500` |" in generated
    assert "| `--eps-clip` | `0.2` | PPO clip range (low side) |" in generated
    assert "- loss `grpo`:" in generated and "- tool `calculator`:" in generated


def test_an_option_added_in_code_shows_up(tmp_path):
    """The page follows the code: a plugin with one more option gives a page with that option."""
    plugin = tmp_path / "extra_options.py"
    plugin.write_text(
        "from plasmid import hookimpl\n"
        "from plasmid.options import Options, option\n\n"
        "class ExtraOptions(Options, group='extra', description='extra'):\n"
        "    extra_knob: int = option(7, 'a knob | with a pipe')\n\n"
        "@hookimpl\n"
        "def plasmid_addoption(parser):\n"
        "    parser.add_options(ExtraOptions)\n")
    page = render(f"grpo,{plugin}")
    assert "| `--extra-knob` | `7` | a knob \\| with a pipe |" in page
    assert "## grpo" in page and "## tasks" not in page


def test_an_unknown_plugin_is_a_one_line_error():
    with pytest.raises(PluginError) as raised:
        render("grpo,no-such-plugin")
    assert "no-such-plugin" in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("argv", [[], ["--plugins", "no-such-plugin"]])
def test_bad_command_lines_are_one_line_errors(capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("plasmid: error: ") and captured.err.count("\n") == 1


def test_docstring_markup_becomes_markdown():
    assert markdown("``x`` and :func:`~a.b.c` and :class:`plasmid.Group`") == "`x` and `c` and `plasmid.Group`"
