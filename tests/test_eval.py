"""``plasmid eval``: the pass@k estimator against hand values, per-set metrics, bad input as one
line, and the command end to end (its accuracy is the training run's ``eval/accuracy``)."""

from __future__ import annotations

import json
import math

import pytest
from plasmid_e2e import read_metrics, run_plasmid

from plasmid.app.evaluate import command_line, eval_set, ks_up_to, pass_at_k, repeat_groups, set_metrics
from plasmid.errors import UsageError
from plasmid.types import Group, Sample, Status


@pytest.mark.parametrize(("n", "c", "k", "want"), [
    (1, 1, 1, 1.0), (1, 0, 1, 0.0),
    (4, 1, 1, 0.25), (4, 2, 1, 0.5),
    (4, 1, 2, 0.5),          # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (4, 2, 2, 5 / 6),        # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (5, 2, 3, 0.9),          # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (4, 3, 2, 1.0),          # fewer than k wrong: every k-subset holds a right one
])
def test_pass_at_k_matches_hand_computed_values(n, c, k, want):
    assert math.isclose(pass_at_k(n, c, k), want, rel_tol=1e-12)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_ks_are_powers_of_two_up_to_and_including_n():
    assert ks_up_to(1) == [1] and ks_up_to(4) == [1, 2, 4] and ks_up_to(6) == [1, 2, 4, 6]


def _sample(prompt: int, correct: bool, length: int, truncated: bool = False) -> Sample:
    return Sample(group_index=prompt, reward=float(correct), reward_components={"exact": float(correct)},
                  response_length=length, status=Status.TRUNCATED if truncated else Status.COMPLETED)


def test_set_metrics_per_prompt_pass_at_k_length_and_truncation():
    samples = [_sample(0, True, 2), _sample(0, False, 4, truncated=True),
               _sample(1, False, 6, truncated=True), _sample(1, False, 4)]
    metrics = set_metrics(samples, "exact", 2)
    assert metrics["prompts"] == 2 and metrics["samples"] == 4
    assert metrics["accuracy"] == 0.25 and metrics["pass@1"] == 0.25
    assert metrics["pass@2"] == 0.5  # prompt 0 solved by one of its two, prompt 1 never
    assert metrics["mean_length"] == 4.0 and metrics["truncation_rate"] == 0.5
    assert "pass@4" not in metrics


def test_repeat_groups_gives_each_copy_its_own_seed_index():
    group = Group([Sample(tokens=[1, 2], index=3, group_index=3, metadata={"a": 1})], index=3)
    copies = repeat_groups([group], 3)[0].samples
    assert [s.index for s in copies] == [9, 10, 11] and {s.group_index for s in copies} == {3}
    copies[0].metadata["a"] = 2
    assert group.samples[0].metadata == {"a": 1}
    assert [s.index for s in repeat_groups([group], 1)[0].samples] == [3]


@pytest.mark.parametrize(("argv", "message"), [
    ([], "exactly one of --checkpoint DIR and --model DIR"),
    (["--checkpoint", "a", "--model", "b"], "exactly one of"),
    (["--checkpoint", "/no/such/dir"], "--checkpoint /no/such/dir: no such directory"),
])
def test_bad_model_choice_is_one_line(argv, message):
    with pytest.raises(UsageError, match=message):
        command_line(argv)


def test_a_checkpoint_without_a_model_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no trainer/model directory"):
        command_line(["--checkpoint", str(tmp_path)])


def test_bad_eval_data_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="expected NAME=PATH"):
        eval_set("justapath.jsonl")
    with pytest.raises(UsageError, match="no such file"):
        eval_set(f"x={tmp_path}/missing.jsonl")


@pytest.mark.timeout(600)
def test_eval_reproduces_training_eval_and_scores_jsonl_sets(tmp_path):
    run = tmp_path / "run"
    trained = run_plasmid("train", "--seed", "1", "--num-rollouts", "2", "--prompts-per-step", "4",
                          "--n-samples-per-prompt", "4", "--eval-interval", "2", "--save-interval", "0",
                          "--run-dir", str(run))
    assert trained.returncode == 0, trained.stderr[-2000:]
    trained_acc = read_metrics(run)[-1]["eval/accuracy"]
    same = run_plasmid("eval", "--checkpoint", str(run), "--seed", "1", "--run-dir", str(tmp_path / "unused"))
    assert same.returncode == 0, same.stderr[-2000:]
    result = json.loads(same.stdout)
    assert result["sets"]["tasks"]["accuracy"] == trained_acc and result["sets"]["tasks"]["pass@1"] == trained_acc
    assert not (tmp_path / "unused").exists()

    rows = [{"prompt": f"{a}+{b}=", "label": str((a + b) % 10)} for a in range(3) for b in range(3)]
    for name in ("small", "tiny"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[: 9 if name == "small"
                                                                                            else 3]))
    out = tmp_path / "results.json"
    sets = run_plasmid("eval", "--model", str(run / "checkpoints" / "step_000001" / "trainer" / "model"),
                       "--eval-data", f"small={tmp_path / 'small.jsonl'}", "--eval-data",
                       f"tiny={tmp_path / 'tiny.jsonl'}", "--eval-n-samples", "3", "--eval-temperature", "1",
                       "--max-new-tokens", "2", "--output", str(out))
    assert sets.returncode == 0, sets.stderr[-2000:]
    document = json.loads(sets.stdout)
    assert json.loads(out.read_text()) == document and document["n_samples"] == 3
    assert document["sampling"]["temperature"] == 1.0 and document["sampling"]["max_new_tokens"] == 2
    small, tiny = document["sets"]["small"], document["sets"]["tiny"]
    assert (small["prompts"], small["samples"], tiny["prompts"], tiny["samples"]) == (9, 27, 3, 9)
    for metrics in (small, tiny):
        assert set(metrics) >= {"accuracy", "pass@1", "pass@2", "pass@3", "mean_length", "truncation_rate"}
        assert metrics["pass@1"] <= metrics["pass@2"] <= metrics["pass@3"]
        assert math.isclose(metrics["pass@1"], metrics["accuracy"])
        assert 0 < metrics["mean_length"] <= 2 and 0 <= metrics["truncation_rate"] <= 1

    bad = run_plasmid("eval", "--model", str(run / "model"), "--eval-data", "small")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "expected NAME=PATH" in bad.stderr
