"""--config FILE (YAML, TOML, JSON) and @args.txt: keys are the options' destinations, flags
override the file, bad files and keys are one line naming the file and key."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Literal

import pytest

from plasmid.app.configfile import plugins_in, read_file
from plasmid.app.start import option_parser
from plasmid.config import OptionParser
from plasmid.errors import UsageError
from plasmid.options import Options, option
from plasmid_serving.native_options import NativeField, add_options


class LoopOptions(Options, group="loop", description="a test plugin's options"):
    steps: int = option(10, "steps", min=1)
    lr: float = option(1e-3, "learning rate")
    mode: Literal["a", "b"] = option("a", "mode")
    whiten: bool = option(False, "whiten")
    verify: bool = option(True, "verify")
    tag: tuple[str, ...] = option((), "tags, repeatable")
    out: str | None = option(None, "where")


#: YAML files need PyYAML (the kernel's extra plasmid[yaml]; the kernel-only env has none)
needs_yaml = pytest.mark.skipif(importlib.util.find_spec("yaml") is None, reason="PyYAML is not installed")


def parser() -> OptionParser:
    made = option_parser()
    made.add_options(LoopOptions)
    add_options(made.getgroup("fw native"), [NativeField("fast", ("C",), "bool", None, "False", "", "fw-"),
                                             NativeField("size", ("C",), "int", None, "1", "", "fw-")])
    return made


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


YAML = """
steps: 3
lr: 1e-5          # PyYAML reads this as a string; the option converts it
whiten: true
verify: false
tag: [x, y]
fw_fast: true
fw-size: 4        # dashes work too
"""

TOML = """
steps = 3
lr = 1e-5
whiten = true
verify = false
tag = ["x", "y"]
fw_fast = true
fw_size = 4
"""


JSON = json.dumps({"steps": 3, "lr": 1e-5, "whiten": True, "verify": False, "tag": ["x", "y"], "fw_fast": True,
                   "fw_size": 4})


@pytest.mark.parametrize(("name", "text"), [pytest.param("run.yaml", YAML, marks=needs_yaml), ("run.toml", TOML),
                                            ("run.json", JSON)])
def test_a_file_sets_options_by_their_destination(tmp_path, name, text):
    path = write(tmp_path / name, text)
    made = parser()
    values = LoopOptions.from_values(vars(made.parse(["--config", path])))
    assert values == LoopOptions(steps=3, lr=1e-5, mode="a", whiten=True, verify=False, tag=("x", "y"), out=None)
    namespace = made.parse(["--config", path])
    assert (namespace.fw_fast, namespace.fw_size) == (True, 4)
    assert not hasattr(namespace, "config")
    assert made.sources(["--config", path]) == dict.fromkeys(
        ["steps", "lr", "whiten", "verify", "tag", "fw_fast", "fw_size"], "file")


@needs_yaml
def test_flags_override_the_file_and_a_repeated_flag_replaces_the_files_list(tmp_path):
    path = write(tmp_path / "run.yaml", YAML)
    made = parser()
    args = ["--steps", "7", "--config", path, "--tag", "z", "--no-whiten"]
    values = LoopOptions.from_values(vars(made.parse(args)))
    assert (values.steps, values.tag, values.whiten, values.verify) == (7, ("z",), False, False)
    sources = made.sources(args)
    assert sources["steps"] == sources["tag"] == sources["whiten"] == "flag"
    assert sources["verify"] == "file" and "mode" not in sources
    assert made.given(args) == frozenset(sources)


@needs_yaml
def test_sections_nest_options_by_plugin_or_group(tmp_path):
    path = write(tmp_path / "run.yaml", "loop:\n  steps: 2\n  mode: b\nfw native:\n  fw_size: 9\n")
    made = parser()
    made.sections.add("myplugin")
    namespace = made.parse(["--config", path])
    assert (namespace.steps, namespace.mode, namespace.fw_size) == (2, "b", 9)
    other = write(tmp_path / "other.yaml", "myplugin: {steps: 5}\n")
    assert made.parse(["--config", other]).steps == 5


@needs_yaml
def test_later_files_override_earlier_ones(tmp_path):
    first = write(tmp_path / "a.yaml", "steps: 2\nmode: b\n")
    second = write(tmp_path / "b.toml", "steps = 5\n")
    namespace = parser().parse(["--config", first, "--config", second])
    assert (namespace.steps, namespace.mode) == (5, "b")


@needs_yaml
def test_null_means_the_default_and_is_not_given(tmp_path):
    path = write(tmp_path / "run.yaml", "out: null\nsteps: 4\n")
    made = parser()
    assert made.parse(["--config", path]).out is None
    assert made.given(["--config", path]) == {"steps"}


@needs_yaml
@pytest.mark.parametrize(("text", "message"), [
    ("step: 3\n", r"run.yaml: unknown option 'step'; did you mean 'steps'"),
    ("loops:\n  steps: 3\n", r"run.yaml: unknown section 'loops'; did you mean 'loop'"),
    ("loop:\n  stepz: 3\n", r"run.yaml: unknown option 'loop.stepz'; did you mean 'steps'"),
    ("steps: many\n", r"run.yaml: steps: argument --steps: invalid int value: 'many'"),
    ("mode: c\n", r"run.yaml: mode: argument --mode: invalid choice: 'c'"),
    ("whiten: 1\n", r"run.yaml: whiten: expected true or false, got 1"),
    ("steps: [1, 2]\n", r"run.yaml: steps: expected one value, got list"),
    ("steps: 3\nloop:\n  steps: 4\n", r"option 'steps' is set twice \(steps and loop.steps\)"),
    ("- steps\n", r"run.yaml: expected a mapping of option names to values at the top, got list"),
    ("steps: [\n", r"run.yaml: invalid YAML at line 2"),
    ("config: other.yaml\n", r"run.yaml: unknown option 'config'"),
])
def test_bad_files_are_one_line_errors_naming_file_and_key(tmp_path, text, message):
    path = write(tmp_path / "run.yaml", text)
    with pytest.raises(UsageError, match=message) as caught:
        parser().parse(["--config", path])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("run.ini", "", r"unknown file type '.ini'"),
    ("run.toml", "steps = \n", r"run.toml: invalid TOML"),
    ("run.json", "{", r"run.json: invalid JSON"),
])
def test_bad_formats_are_one_line_errors(tmp_path, name, text, message):
    path = write(tmp_path / name, text)
    with pytest.raises(UsageError, match=message):
        parser().parse(["--config", path])


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(UsageError, match="nope.yaml: no such file"):
        parser().parse(["--config", str(tmp_path / "nope.yaml")])
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        parser().parse(["--config", str(tmp_path / "d.yaml")])


def test_yaml_without_pyyaml_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)   # import yaml now raises ImportError
    path = write(tmp_path / "run.yaml", "steps: 2\n")
    with pytest.raises(UsageError, match=r"needs PyYAML: pip install 'plasmid\[yaml\]'"):
        read_file(path)


def test_a_runs_config_json_is_read_as_its_options(tmp_path):
    saved = {"option": {"steps": 2, "mode": "b", "reward_weights": [["exact", 1.0]]},
             "plugin_lock": [], "run_dir": "runs/x"}
    path = write(tmp_path / "config.json", json.dumps(saved))
    assert read_file(path) == {"steps": 2, "mode": "b"}
    assert parser().parse(["--config", path]).mode == "b"


@needs_yaml
def test_plugins_are_read_from_the_file_before_the_options(tmp_path):
    path = write(tmp_path / "run.yaml", "plugins: [a, no:b]\nsteps: 2\n")
    assert plugins_in([path]) == "a,no:b"
    bad = write(tmp_path / "bad.yaml", "plugins: 3\n")
    with pytest.raises(UsageError, match="plugins: expected a string"):
        plugins_in([bad])


def test_argument_files_take_shell_words_and_comments(tmp_path):
    path = write(tmp_path / "args.txt", "--steps 4   # four\n--mode=b\n\n--tag 'a b'\n")
    namespace = parser().parse([f"@{path}", "--steps", "6"])
    assert (namespace.steps, namespace.mode, namespace.tag) == (6, "b", ["a b"])
    with pytest.raises(UsageError, match="cannot read the argument file"):
        parser().parse([f"@{tmp_path / 'missing.txt'}"])


@needs_yaml
def test_the_plugin_selection_is_read_from_argument_and_config_files_before_loading(tmp_path):
    from plasmid.app import configfile
    from plasmid.startup import preparse

    args = write(tmp_path / "args.txt", "--plugins a,b\n")
    config = write(tmp_path / "run.yaml", "plugins: c\n")
    assert preparse([f"@{args}"], configfile).plugins == "a,b"
    assert preparse(["--config", config], configfile).plugins == "c"
    assert preparse(["--config", config, "--plugins", "d"], configfile).plugins == "d"
    assert preparse(["--config", write(tmp_path / "none.yaml", "steps: 1\n")], configfile).plugins is None
