"""``plasmid train --datasource reasoning-gym --rg-dataset basic_arithmetic --reward reasoning-gym``
runs with no --model (the recipe's tiny model) end to end, and resume refuses other entries."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plasmid_reasoning_gym import plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config

COMMAND = ["train", "--datasource", "reasoning-gym", "--rg-dataset", "basic_arithmetic", "--reward", "reasoning-gym"]
#: Only what keeps the run short (two steps); the rest is the README's command.
SHORT = ["--num-rollouts", "2", "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "1",
         "--rg-eval-size", "4", "--rg-size", "200", "--save-interval", "0"]


@pytest.mark.timeout(300)
def test_the_readme_command_trains_two_steps_without_a_model(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", *COMMAND, *SHORT, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert all("rollout/reward/reasoning-gym" in m and "eval/accuracy" in m for m in metrics)
    # per-dataset reward metrics: the samples name their dataset as the mixture's subset
    assert all("rollout/reward/reasoning-gym/basic_arithmetic" in m and "rollout/accuracy/basic_arithmetic" in m
               for m in metrics), sorted(metrics[0])
    assert (run_dir / "model" / "config.json").is_file()
    config = json.loads((run_dir / "model" / "config.json").read_text())
    assert config["max_position_embeddings"] >= 1 + 32 + 1 and config["max_position_embeddings"] % 64 == 0


def test_the_readme_line_installs_what_the_command_needs_from_a_fresh_venv():
    """The README's one-liner installs the embedded plugins (engine, trainer, loss, tokenizer) with this
    adapter, not the adapter alone (plasmid and plasmid-torch are not on PyPI); run by hand in a fresh
    venv, see the README's Environments section."""
    root = Path(__file__).resolve().parents[4]
    line = f"pip install -r requirements/environments-reasoning-gym.txt && plasmid {' '.join(COMMAND)}"
    for readme in (root / "README.md", root / "plugins" / "environments" / "reasoning-gym" / "README.md"):
        assert line in readme.read_text(), readme
    requirements = (root / "requirements" / "environments-reasoning-gym.txt").read_text().splitlines()
    assert [r for r in requirements if r and not r.startswith("#")] == ["-r embedded.txt",
                                                                        "-e ./plugins/environments/reasoning-gym"]
    embedded = (root / "requirements" / "embedded.txt").read_text()
    for needed in ("torch==2.13.0", "./core", "./plugins/generators/torchgen", "./plugins/trainers/torchtrain",
                   "./plugins/losses/grpo", "./plugins/tokenizers/hf", "./plugins/rollouts/rollout"):
        assert needed in embedded


def test_resume_refuses_a_state_saved_for_other_entries(tmp_path):
    def source(**options):
        config = make_config(plugin, run_dir=tmp_path / "run", datasource="reasoning-gym", rg_size=20,
                             rg_eval_size=2, **options)
        return build("datasource", "reasoning-gym", plugin, config=config)

    saved = source()
    saved.get_groups(2)
    state = json.loads(json.dumps(saved.state_dict()))
    with pytest.raises(UsageError, match="resume with the same --rg-dataset"):
        source(rg_seed=5).load_state_dict(state)
    resumed = source()
    resumed.load_state_dict(state)
    assert [g.samples[0].label for g in resumed.get_groups(3)] == [g.samples[0].label for g in saved.get_groups(3)]
