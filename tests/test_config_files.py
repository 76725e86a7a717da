"""plasmid train --config FILE end to end: a run's own config.json is a valid --config giving the
same resolved configuration, and the file's plugin selection decides which options it may set."""

from __future__ import annotations

import json

import pytest
from plasmid_e2e import run_plasmid

from plasmid.app.show_config import train_options
from plasmid.app.start import start
from plasmid.errors import UsageError

RUN_YAML = """
# one short step of the quickstart
num_rollouts: 1
prompts_per_step: 2
n_samples_per_prompt: 2
rollout:
  max_new_tokens: 1
eval_interval: 0
save_interval: 0
"""


@pytest.mark.timeout(300)
def test_a_runs_config_json_fed_back_gives_the_same_resolved_config(tmp_path):
    (tmp_path / "run.yaml").write_text(RUN_YAML)
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--config", str(tmp_path / "run.yaml"), "--run-dir", str(run_dir), timeout=280)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["option"]["num_rollouts"] == 1 and saved["option"]["max_new_tokens"] == 1
    shown = run_plasmid("config", "show", "--config", str(run_dir / "config.json"), "--json", timeout=120)
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["option"] == saved["option"] and report["run_dir"] == saved["run_dir"]
    assert report["plugin_lock"] == saved["plugin_lock"]
    assert report["source"]["num_rollouts"] == report["source"]["max_new_tokens"] == "file"
    assert report["batch"]["samples_per_step"] == 4 and report["batch"]["max_response_tokens_per_step"] == 4
    other = start(["--config", str(run_dir / "config.json"), "--run-dir", str(tmp_path / "b"), "--lr", "0.25"],
                  add_options=train_options())
    assert other.config.option.lr == 0.25 and other.config.option.num_rollouts == 1


PLUGIN = '''
from plasmid import hookimpl
from plasmid.options import Options, option


class KnobOptions(Options, group="knob"):
    extra_knob: int = option(1, "a knob only this plugin declares", min=0)


@hookimpl
def plasmid_addoption(parser):
    parser.add_options(KnobOptions)
'''


def test_the_files_plugin_selection_decides_which_options_exist(tmp_path):
    plugin = tmp_path / "knobplugin.py"
    plugin.write_text(PLUGIN)
    with_plugin = tmp_path / "with.toml"
    with_plugin.write_text(f'plugins = "{plugin}"\nextra_knob = 3\n[knob]\n')
    config = start(["--config", str(with_plugin), "--run-dir", str(tmp_path / "r")]).config
    assert config.option.extra_knob == 3 and config.is_given("extra_knob")
    without = tmp_path / "without.toml"
    without.write_text("extra_knob = 3\n")
    with pytest.raises(UsageError, match="without.toml: unknown option 'extra_knob'"):
        start(["--config", str(without), "--run-dir", str(tmp_path / "r")])


def test_bad_config_on_the_command_line_is_one_line(tmp_path):
    (tmp_path / "run.yaml").write_text("num_rolouts: 2\n")
    proc = run_plasmid("train", "--config", str(tmp_path / "run.yaml"), timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"plasmid: error: --config {tmp_path / 'run.yaml'}: unknown option 'num_rolouts'; "
                               f"did you mean 'num_rollouts'")
