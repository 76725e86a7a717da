"""``plasmid train --datasource verifiers --vf-env NAME``: a few steps on the recipe's tiny model,
the environment's rollout driving the engine through the agent gateway, its rubric the reward."""

from __future__ import annotations

import json

import pytest

from plasmid.cli import main


@pytest.mark.timeout(300)
def test_plasmid_train_with_a_verifiers_environment_trains_on_the_engines_tokens(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--datasource", "verifiers", "--vf-env", "vf_plasmid_sum", "--num-rollouts", "2",
                 "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
                 "--save-interval", "0", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "datasource=verifiers" in err and "generate=agent" in err and "reward=verifiers" in err
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert step["train/samples"] == 4.0 and "rollout/reward/verifiers" in step
        assert "rollout/reward/verifiers.exact" in step and "rollout/reward/verifiers.short" in step, \
            "each rubric function is logged as a reward component"
        assert step["rollout/agent/calls_mean"] == 1.0
        assert step["train/logprob_abs_diff_mean"] <= 1e-4, "the gateway's log-probs are the engine's"
