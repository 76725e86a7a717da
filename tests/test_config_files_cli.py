"""The commands a person meets first: every one answers --help and turns bad input into one line;
plasmid train --help is readable (common options first, then by plugin, every default shown,
native pass-through options summarised); plasmid --version; plasmid config show."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from plasmid.app.cli import main
from plasmid.plugins import installed_entry_points

COMMANDS = ["train", "config", "config show", "plugins", "plugins show", "plugins check", "score", "new-plugin",
            "rollout", "replay", "eval"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``plasmid ARGV`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:   # argparse's --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", COMMANDS + [""])
def test_every_command_answers_help(capsys, command):
    code, out, err = run(capsys, *command.split(), "--help")
    assert code == 0, err
    assert "usage" in out.lower() or "plasmid" in out.lower()
    assert not err.strip() or "warning" in err


BAD = [
    ("bogus",),
    ("train", "--bogus-flag"),
    ("train", "--num-rollouts", "zero"),
    ("config",  "shwo"),
    ("config", "show", "--bogus-flag"),
    ("plugins", "--bogus-flag"),
    ("plugins", "lsit"),
    ("plugins", "show"),
    ("plugins", "show", "nosuchplugin"),
    ("score", "--bogus-flag"),
    ("new-plugin",),
    ("new-plugin", "reward", "Bad Name"),
    ("rollout", "--bogus-flag"),
    ("replay",),
    ("eval",),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv", BAD, ids=" ".join)
def test_bad_input_to_every_command_is_one_line(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)    # new-plugin writes nothing on bad input; nothing else may either
    code, out, err = run(capsys, *argv)
    lines = [line for line in err.splitlines() if not line.startswith("plasmid: warning:")]
    assert code == 2, (out, err)
    assert len(lines) == 1 and lines[0].startswith("plasmid: error: "), err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []


NATIVE_PLUGIN = '''
from plasmid import hookimpl
from plasmid_serving.native_options import NativeField, add_options
from plasmid.options import Options, option


class KnobOptions(Options, group="knob", description="the test plugin's own"):
    knob_size: int = option(3, "how big", min=1)


FIELDS = [NativeField(f"{'ab'[i % 2]}field_{i}", ("FwConfig",), "int", None, str(i), "A field.", "fw-")
          for i in range(40)]


@hookimpl
def plasmid_addoption(parser):
    parser.add_options(KnobOptions)
    add_options(parser.getgroup("fw native", "a framework's own fields"), FIELDS)
'''


def entries(text: str) -> list[str]:
    """The option entries of a help text (an entry starts with two spaces and a dash)."""
    return [chunk for chunk in re.split(r"\n(?=  -)", text) if chunk.startswith("  -")]


@pytest.mark.timeout(300)
def test_train_help_puts_common_options_first_groups_by_plugin_and_summarises_native_ones(capsys, tmp_path):
    plugin = tmp_path / "knob.py"
    plugin.write_text(NATIVE_PLUGIN)
    code, short, _ = run(capsys, "train", "--plugins", str(plugin), "--help")
    assert code == 0
    code, full, _ = run(capsys, "train", "--plugins", str(plugin), "--help-all")
    assert code == 0
    headings = [line for line in short.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert headings[:5] == ["help:", "common: model and data:", "common: algorithm:", "common: schedule:",
                            "common: runtime:"]
    kernel = [i for i, h in enumerate(headings) if h.startswith("kernel: ")]
    plugins = [i for i, h in enumerate(headings) if h.startswith(("plugin ", "library "))]
    assert kernel and plugins and max(kernel) < min(plugins)
    assert "plugin knob (local file): knob:" in headings
    assert "plugin torchtrain (plasmid-torchtrain " in short
    assert all("default" in entry for entry in entries(short) if not entry.startswith(("  -h", "  --help-all")))
    assert "  fw native: 40 options --fw-*" in short and "--fw-bfield-1 " not in short
    assert "--fw-bfield-1 INT" in full and "--help-all" in short
    assert short.index("  --model") < short.index("  --knob-size") and short.count("\n  --lr ") == 1
    assert len(short.splitlines()) < len(full.splitlines()) - 40
    assert short.splitlines()[0] == "usage: plasmid train [--config FILE] [@ARGS_FILE] [OPTIONS]"


def test_version_names_the_kernel_and_every_plugin(capsys):
    import plasmid

    code, out, _ = run(capsys, "--version")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"plasmid {plasmid.__version__} (plugin API {plasmid.API_VERSION})"
    for name, ep in installed_entry_points().items():
        assert any(line.split() == [name, ep.dist.name, ep.dist.version] for line in lines[1:]), name


@pytest.mark.timeout(300)
def test_config_show_gives_each_values_source_and_the_batch_sizes(capsys, tmp_path, monkeypatch):
    # a plugin selection from the environment (its source is "environment"); blocking Ray where it is
    # installed also keeps its runtime options out of the view, and no:X must name an installed plugin
    blocked = "ray" if importlib.util.find_spec("plasmid_ray") is not None else "tools"
    monkeypatch.setenv("PLASMID_PLUGINS", f"no:{blocked}")
    (tmp_path / "run.toml").write_text("num_rollouts = 3\nmax_new_tokens = 5\nglobal_batch_size = 3\n"
                                       "micro_batch_size = 2\n[rollout]\nprompts_per_step = 2\n")
    argv = ["config", "show", "--config", str(tmp_path / "run.toml"), "--n-samples-per-prompt", "3",
            "--run-dir", str(tmp_path / "r")]
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    report = json.loads(out)
    source = report["source"]
    assert (source["num_rollouts"], source["prompts_per_step"], source["n_samples_per_prompt"]) == (
        "file", "file", "flag")
    assert (source["plugins"], source["loss"], source["seed"], source["reward_weights"]) == (
        "environment", "resolved", "default", "derived")
    assert report["option"]["num_rollouts"] == 3 and "show_json" not in report["option"]
    assert report["batch"] == {"prompts_per_step": 2, "n_samples_per_prompt": 3, "samples_per_step": 6,
                               "groups_started_per_step": 2, "samples_per_optimizer_step": 3,
                               "optimizer_steps_per_step": 2, "trainer_workers": 1,
                               "micro_batches_per_optimizer_step": 2, "max_response_tokens_per_step": 30,
                               "max_tokens_per_micro_batch": None}
    assert not (tmp_path / "r").exists()
    code, text, _ = run(capsys, *argv)
    assert code == 0
    assert "  num_rollouts = 3  (file)" in text and "  n_samples_per_prompt = 3  (flag)" in text
    assert "2 prompts x 3 samples = 6 samples" in text and "2 optimizer step(s) of 3 samples" in text
