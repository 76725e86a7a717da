"""``plasmid train --datasource gym --gym-env textarena:GuessTheNumber-v0-train``: the recipe's
generate function, reward and tiny model, a few steps on a CPU against the real TextArena."""

from __future__ import annotations

import json

import pytest

from plasmid.cli import main


@pytest.mark.timeout(300)
def test_plasmid_train_plays_guess_the_number_with_the_recipe(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--datasource", "gym", "--gym-env", "textarena:GuessTheNumber-v0-train",
                 "--gym-max-turns", "2", "--gym-size", "8", "--gym-eval-size", "2", "--num-rollouts", "2",
                 "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
                 "--save-interval", "0", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "datasource=gym" in err and "generate=gym" in err and "reward=gym" in err
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert step["train/samples"] == 4.0 and "rollout/reward/gym" in step
        assert step["train/logprob_abs_diff_mean"] <= 1e-4
