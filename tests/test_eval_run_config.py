"""``plasmid eval``/``rollout``/``score`` on a run trained with a data source of its own: the run's ``config.json``
decides the eval split, the token budget and the rewards (issue 35: a ``--datasource`` run was evaluated on the
built-in task with 64 new tokens, and its ``config.json`` was refused as ``--config``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from plasmid_e2e import read_metrics, run_plasmid

TINY = ["--seed", "0", "--num-rollouts", "2", "--prompts-per-step", "2", "--n-samples-per-prompt", "2",
        "--eval-interval", "0", "--save-interval", "0"]


@pytest.mark.timeout(900)
def test_a_jsonl_run_is_evaluated_on_its_own_split_with_its_own_budget(tmp_path):
    base = tmp_path / "base"
    built = run_plasmid("train", *TINY, "--run-dir", str(base))   # the quickstart builds a tiny model
    assert built.returncode == 0, built.stderr[-2000:]
    rows = [{"prompt": f"{a}{b}{c}=", "label": str((a + b + c) % 10)} for a in range(3) for b in range(3)
            for c in range(2)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    run = tmp_path / "run"
    trained = run_plasmid("train", *TINY, "--model", str(base / "model"), "--datasource", "jsonl",
                          "--prompt-data", str(tmp_path / "train.jsonl"), "--eval-prompt-data",
                          str(tmp_path / "eval.jsonl"), "--max-new-tokens", "3", "--save-rollouts",
                          str(tmp_path / "saved"), "--run-dir", str(run))
    assert trained.returncode == 0, trained.stderr[-2000:]
    model = run / "checkpoints" / "step_000001" / "trainer" / "model"

    evaluated = run_plasmid("eval", "--checkpoint", str(run))
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    document = json.loads(evaluated.stdout)
    assert list(document["sets"]) == ["jsonl"] and document["sets"]["jsonl"]["prompts"] == 5
    assert document["sampling"]["max_new_tokens"] == 3 and document["model"] == str(model)
    [line] = [line for line in evaluated.stderr.splitlines() if line.startswith("plasmid eval:")]
    assert f"data source jsonl (eval_prompt_data={tmp_path / 'eval.jsonl'}), eval split: 5 prompts" in line
    assert "at most 3 new tokens" in line

    # the run's config.json as --config (was: unknown option 'save_rollouts'); the command line still wins
    again = run_plasmid("eval", "--config", str(run / "config.json"), "--model", str(model), "--max-new-tokens", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["sampling"]["max_new_tokens"] == 2
    assert json.loads(again.stdout)["sets"]["jsonl"]["prompts"] == 5

    scored = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "score", "--config", str(run / "config.json"),
                             "--label", "4"], input="4\n", capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert json.loads(scored.stdout)["components"] == {"exact": 1.0}

    rolled = run_plasmid("rollout", "--checkpoint", str(run / "checkpoints" / "step_000001"), "--num-rollouts",
                         "1", "--run-dir", str(tmp_path / "rolled"))
    assert rolled.returncode == 0, rolled.stderr[-2000:]
    [row] = read_metrics(tmp_path / "rolled")
    assert row["rollout/response_length_max"] <= 3
    assert "plasmid rollout: data source jsonl (prompt_data=" in rolled.stderr
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["step_000000.jsonl", "step_000001.jsonl"]

    missing = run_plasmid("rollout", "--checkpoint", str(tmp_path / "nope"), "--run-dir", str(tmp_path / "never"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such directory" in missing.stderr
    assert not (tmp_path / "never").exists()
