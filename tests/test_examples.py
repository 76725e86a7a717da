"""examples/: each CPU recipe trains two steps through ``plasmid train --config`` (made small from
the command line: ``--num-rollouts 2`` and smaller batches, the flags overriding the file), and
each GPU recipe parses and resolves every option through ``plasmid config show`` where its
plugins are installed (skipped otherwise), on a tiny stand-in model and on CPU (the file's
``--model`` and ``--device`` are overridden: there is no GPU or real model in the test env)."""

from __future__ import annotations

import json
import re
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plasmid_e2e import read_metrics, run_plasmid

from plasmid.plugins import installed_entry_points

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CPU_RECIPES = sorted(EXAMPLES.glob("*.yaml"))
GPU_RECIPES = sorted((EXAMPLES / "gpu").glob("*.yaml"))
SMALL = ["--num-rollouts", "2", "--prompts-per-step", "4", "--n-samples-per-prompt", "4", "--eval-interval", "0",
         "--save-interval", "0"]
#: Extra flags per CPU recipe that only shorten it (the toolcalc recipe's warm start; the code
#: recipe's sandboxed runs, one per response).
SHORTER = {"toolcalc-multiturn.yaml": ["--toolcalc-warmup-steps", "5"],
           "tiny-programs-code.yaml": ["--prompts-per-step", "2"],
           "tiny-vlm.yaml": ["--colours-warmup-steps", "2"]}
#: The plugin providing each provider a recipe names (family option -> provider -> plugin).
PROVIDERS = {"torchgen": "torchgen", "torchtrain": "torchtrain", "grpo": "grpo", "dapo": "grpo", "ppo": "ppo",
             "tasks": "tasks", "jsonl": "jsonl", "exact": "match", "math": "math", "calculator": "tools",
             "multiturn": "multiturn", "vision": "torchgen", "zero-std": "dynamic", "code": "code", "sglang": "sglang",
             "sglang-tensor": "sglang", "sglang-distributed": "sglang", "megatron": "megatron", "ray": "ray"}
BASE = ["hf", "rollout", "sync"]


def recipe_plugins(recipe: Path) -> list[str]:
    """The plugins a recipe needs: those of every provider it names, plus tokenizer, driver and sync."""
    options = yaml.safe_load(recipe.read_text())
    named = []
    for key in ("datasource", "engine", "generate", "trainer", "loss", "weight_sync", "runtime", "reward", "filter",
                "tools"):
        value = options.get(key)
        named += value if isinstance(value, list) else [value] if value else []
    return sorted({*BASE, *(PROVIDERS[name] for name in named)})


def test_the_recipes_are_there():
    assert {p.name for p in CPU_RECIPES} == {"quickstart-grpo.yaml", "toolcalc-multiturn.yaml",
                                             "tiny-programs-code.yaml", "tiny-vlm.yaml"}
    assert {p.name for p in GPU_RECIPES} == {"grpo-gsm8k-torchtrain.yaml", "grpo-gsm8k-sglang.yaml",
                                             "dapo-math-dynamic-sampling.yaml", "ppo-megatron-critic.yaml"}
    for recipe in CPU_RECIPES + GPU_RECIPES:
        header = recipe.read_text().split("\n\n")[0]
        assert "Hardware:" in recipe.read_text() and "Expected" in recipe.read_text(), recipe
        assert header.startswith("# "), recipe


def built_model(recipe: Path, where: Path) -> list[str]:
    """``--model DIR`` for a recipe whose header builds its model (``python -c "..."`` writing
    the recipe's ``model:``), run as written with the directory moved to ``where``; else nothing."""
    model = yaml.safe_load(recipe.read_text()).get("model")
    command = re.search(r'^#\s+python -c "(.*)"$', recipe.read_text(), re.MULTILINE)
    if model is None:
        return []
    assert command is not None and f"'{model}'" in command.group(1), f"{recipe.name}: how is {model} built?"
    target = where / "model"
    subprocess.run([sys.executable, "-c", command.group(1).replace(f"'{model}'", repr(str(target)))], check=True,
                   timeout=300)
    return ["--model", str(target)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("recipe", CPU_RECIPES, ids=lambda p: p.stem)
def test_a_cpu_recipe_trains(recipe, tmp_path):
    run_dir = tmp_path / "run"
    model = built_model(recipe, tmp_path)
    shorter = [*SMALL, *SHORTER.get(recipe.name, []), *model]
    proc = run_plasmid("train", "--config", str(recipe), "--plugins", ",".join(recipe_plugins(recipe)), *shorter,
                       "--run-dir", str(run_dir), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    steps = read_metrics(run_dir)
    assert len(steps) == 2
    options = yaml.safe_load(recipe.read_text())
    for name in options.get("reward", []):
        assert all(0.0 <= step[f"rollout/reward/{name}"] <= 1.0 for step in steps), name
    written = json.loads((run_dir / "config.json").read_text())["option"]
    for key, value in options.items():
        if f"--{key.replace('_', '-')}" not in shorter:
            assert written[key] == value, key


@pytest.fixture(scope="module")
def stand_in_model(tmp_path_factory):
    """A tiny model whose character tokenizer covers the example data (and has a chat template), with a
    context as long as a real model's (4096 positions): start-up refuses a recipe's --max-new-tokens past it."""
    from plasmid_torch.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", alphabet=string.printable.strip() + " ",
                            max_positions=4096)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_a_gpu_recipe_resolves(recipe, stand_in_model):
    plugins = recipe_plugins(recipe)
    missing = sorted(set(plugins) - set(installed_entry_points()))
    if missing:
        pytest.skip(f"{recipe.name} needs plugins that are not installed here: {', '.join(missing)}")
    proc = run_plasmid("config", "show", "--json", "--config", str(recipe), "--plugins", ",".join(plugins),
                       "--model", str(stand_in_model), "--device", "cpu", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    for key, value in yaml.safe_load(recipe.read_text()).items():
        if key not in ("model", "device"):
            assert shown["option"][key] == value, key
            assert shown["source"][key] == "file", key
