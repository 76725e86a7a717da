"""``plasmid train`` checks everything before it writes: a bad option, model, data file or run
directory is one ``plasmid: error:`` line, exit 2, and the run directory is as it was (absent,
or byte for byte the same), also when the failure comes after the quickstart's tiny model was
built."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from plasmid.app.cli import main
from plasmid.errors import UsageError
from plasmid.startup import start

#: One short step of the quickstart (a run that gets through start-up takes seconds).
FAST = ["--num-rollouts", "1", "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
        "--save-interval", "0"]

BOOM_REWARD = '''
from plasmid import hookimpl


class Boom:
    def __init__(self, config):
        raise RuntimeError("boom at construction")


@hookimpl
def plasmid_rewards(register):
    register("boom", Boom)
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from plasmid_torch.tiny import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


def snapshot(path: Path) -> dict[str, bytes] | None:
    """Every file under ``path`` with its bytes (directories as ``b"<dir>"``), or ``None`` if absent."""
    if not path.exists():
        return None
    return {str(p.relative_to(path)): (b"<dir>" if p.is_dir() else p.read_bytes()) for p in sorted(path.rglob("*"))}


def train_fails(capsys, *args: str) -> str:
    """Run ``plasmid train FAST ARGS`` in this process; assert it failed as a user error should
    (exit 2, one ``plasmid: error:`` line, no traceback) and return that line."""
    code = main(["train", *FAST, *args])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("plasmid: error:")]
    assert code == 2, err
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


VERL_ROWS = [{"prompt": f"{a}+{b}=", "reward_model": {"ground_truth": str((a + b) % 10), "style": "rule"}}
             for a in range(3) for b in range(3)]


def test_a_label_key_missing_in_the_data_stops_before_anything_is_written(capsys, tmp_path, model):
    data = write_jsonl(tmp_path / "verl.jsonl", VERL_ROWS)
    run_dir = tmp_path / "run"
    line = train_fails(capsys, "--datasource", "jsonl", "--model", str(model), "--prompt-data", str(data),
                       "--label-key", "reward_model.answer", "--run-dir", str(run_dir))
    assert f"{data}:1: the row has no 'reward_model.answer' key (--label-key)" in line
    assert "'ground_truth', 'style'" in line
    assert not run_dir.exists()


def test_an_old_run_directory_is_left_byte_identical(capsys, tmp_path):
    """The tiny model is built only after the run directory is checked (it used to be built into
    the old run's directory before the refusal)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    before = snapshot(run_dir)
    line = train_fails(capsys, "--run-dir", str(run_dir))
    assert f"--run-dir {run_dir} already holds a run" in line
    assert snapshot(run_dir) == before


@pytest.mark.parametrize("existing", [False, True])
def test_a_failure_after_the_tiny_model_was_built_leaves_nothing(capsys, tmp_path, existing):
    run_dir = tmp_path / "run"
    if existing:
        run_dir.mkdir()
        (run_dir / "notes.txt").write_text("mine")
    before = snapshot(run_dir)
    boom = tmp_path / "boom_reward.py"
    boom.write_text(BOOM_REWARD)
    line = train_fails(capsys, "--plugins", str(boom), "--reward", "boom", "--run-dir", str(run_dir))
    assert "reward 'boom'" in line and "boom at construction" in line
    assert snapshot(run_dir) == before


def chattr(flag: str, path: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_an_unwritable_run_directory_is_named_and_left_as_it_was(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if not chattr("+i", run_dir):
        pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE and ext4/xfs); root ignores modes")
    try:
        line = train_fails(capsys, "--run-dir", str(run_dir))
        assert line == (f"plasmid: error: --run-dir {run_dir}: {run_dir} is not writable (permission denied); "
                        f"choose a writable --run-dir")
        assert snapshot(run_dir) == {}
        line = train_fails(capsys, "--run-dir", str(run_dir / "sub" / "run"))
        assert f"--run-dir {run_dir / 'sub' / 'run'}: {run_dir} is not writable" in line
    finally:
        chattr("-i", run_dir)
    assert snapshot(run_dir) == {}


def test_a_run_directory_under_a_file_is_named(capsys, tmp_path):
    (tmp_path / "afile").write_text("x")
    line = train_fails(capsys, "--run-dir", str(tmp_path / "afile" / "run"))
    assert f"{tmp_path / 'afile'} is a file, not a directory" in line
    assert (tmp_path / "afile").read_text() == "x"


def test_a_model_with_weights_but_no_tokenizer_is_refused_at_start_up(capsys, tmp_path, model):
    weights_only = tmp_path / "weights_only"
    shutil.copytree(model, weights_only, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*", "vocab*"))
    run_dir = tmp_path / "run"
    line = train_fails(capsys, "--model", str(weights_only), "--run-dir", str(run_dir))
    assert f"--model {weights_only} has no tokenizer" in line and "model.safetensors" in line
    assert not run_dir.exists()


def test_a_model_directory_that_does_not_exist_is_refused(capsys, tmp_path):
    line = train_fails(capsys, "--model", str(tmp_path / "nope"), "--run-dir", str(tmp_path / "run"))
    assert f"--model {tmp_path / 'nope'}: no such directory" in line
    assert not (tmp_path / "run").exists()


def test_jsonl_without_a_model_says_to_pass_one(capsys, tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "1+1=", "label": "2"}])
    line = train_fails(capsys, "--datasource", "jsonl", "--prompt-data", str(data), "--run-dir", str(tmp_path / "run"))
    assert "--datasource jsonl needs --model DIR" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("loss", ["grpo", "rloo", "reinforce++-baseline"])
def test_a_group_normalised_loss_with_one_sample_per_prompt_is_refused(capsys, tmp_path, loss):
    line = train_fails(capsys, "--loss", loss, "--n-samples-per-prompt", "1", "--run-dir", str(tmp_path / "run"))
    assert f"--loss {loss} needs --n-samples-per-prompt of at least 2" in line
    learns_from_one = line.split("learns from 1: ", 1)[1].split(", ")
    assert {"ppo", "reinforce++"} <= set(learns_from_one) and loss not in learns_from_one
    assert not (tmp_path / "run").exists()


def test_losses_without_group_baselines_start_with_one_sample_per_prompt(tmp_path):
    for loss in ("reinforce++", "ppo"):
        start(["--loss", loss, "--n-samples-per-prompt", "1", "--run-dir", str(tmp_path / "run")])
    with pytest.raises(UsageError, match="needs --n-samples-per-prompt of at least 2"):
        start(["--loss", "dr-grpo", "--n-samples-per-prompt", "1", "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------- context limits (issue 30)
ROWS = [{"prompt": "1+2=", "label": "3"}, {"prompt": "4+4=", "label": "8"}, {"prompt": "1" * 254 + "=", "label": "1"},
        {"prompt": "2+5=", "label": "7"}]


@pytest.mark.parametrize(("args", "message"), [
    (["--max-prompt-length", "0"], "plasmid: error: --max-prompt-length 0: must be >= 1"),
    (["--max-prompt-length", "x"], "plasmid: error: argument --max-prompt-length: invalid int value: 'x'"),
    (["--overlong-prompts", "truncate"], "plasmid: error: argument --overlong-prompts: invalid choice: 'truncate'"),
])
def test_a_bad_value_of_the_prompt_options_writes_nothing(capsys, tmp_path, args, message):
    line = train_fails(capsys, *args, "--run-dir", str(tmp_path / "run"))
    assert line.startswith(message)
    assert not (tmp_path / "run").exists()


def test_max_new_tokens_past_the_models_context_is_refused_before_anything_is_written(capsys, tmp_path, model):
    line = train_fails(capsys, "--model", str(model), "--max-new-tokens", "300", "--run-dir", str(tmp_path / "run"))
    assert line == (f"plasmid: error: --max-new-tokens 300: the model at {model} has a context of 256 tokens "
                    f"(max_position_embeddings in config.json), so a response of 300 tokens leaves no room for a "
                    f"prompt; lower --max-new-tokens (at most 255)")
    assert not (tmp_path / "run").exists()


def test_a_max_prompt_length_past_the_models_context_is_refused(capsys, tmp_path, model):
    line = train_fails(capsys, "--model", str(model), "--max-new-tokens", "8", "--max-prompt-length", "250",
                       "--run-dir", str(tmp_path / "run"))
    assert "--max-prompt-length 250: a prompt of 250 tokens and a response of --max-new-tokens 8 need 258 " in line
    assert "give at most 248" in line
    assert not (tmp_path / "run").exists()


def test_an_overlong_row_with_overlong_prompts_error_names_the_row_and_both_lengths(capsys, tmp_path, model):
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    line = train_fails(capsys, "--datasource", "jsonl", "--model", str(model), "--prompt-data", str(data),
                       "--max-new-tokens", "16", "--overlong-prompts", "error", "--run-dir", str(tmp_path / "run"))
    assert line == (f"plasmid: error: {data}:3: the prompt has 256 tokens, more than --max-prompt-length 240 (the "
                    f"model's context of 256 tokens minus --max-new-tokens 16); shorten or remove the row, or skip "
                    f"such rows with --overlong-prompts drop")
    assert not (tmp_path / "run").exists()


def test_a_character_the_tokenizer_cannot_encode_is_named_before_anything_is_written(capsys, tmp_path, model):
    data = write_jsonl(tmp_path / "rows.jsonl", [*ROWS[:2], {"prompt": "3×4=", "label": "12"}])
    line = train_fails(capsys, "--datasource", "jsonl", "--model", str(model), "--prompt-data", str(data),
                       "--run-dir", str(tmp_path / "run"))
    assert line.startswith(f"plasmid: error: {data}:3: the tokenizer cannot encode the character '×' (U+00D7) of "
                           f"the prompt (Exception: WordLevel error: Missing [UNK] token from the vocabulary)")
    assert not (tmp_path / "run").exists()


def test_overlong_rows_are_dropped_counted_and_logged_once(capsys, tmp_path, model):
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    run_dir = tmp_path / "run"
    code = main(["train", *FAST, "--num-rollouts", "2", "--datasource", "jsonl", "--model", str(model),
                 "--prompt-data", str(data), "--max-new-tokens", "4", "--reward", "math", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (f"plasmid: dropped 1 of 4 prompts of --prompt-data {data}: longer than --max-prompt-length 252 (the "
            f"model's context of 256 tokens minus --max-new-tokens 4) (the first: {data}:3, 256 tokens)") in err
    # the tiny model's char tokenizer has a chat template, and --model was given: plain prompts are warned about
    assert (f"plasmid: warning: the tokenizer of --model {model} has a chat template (an instruct model?), but the "
            f"prompts of --prompt-data {data} are encoded as plain text; add --apply-chat-template") in err
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [step.get("data/dropped_overlong") for step in steps] == [1.0, None]


def test_a_bad_value_of_task_apply_chat_template_in_a_config_file_writes_nothing(capsys, tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"task_apply_chat_template": "maybe"}))
    line = train_fails(capsys, "--config", str(tmp_path / "run.json"), "--run-dir", str(tmp_path / "run"))
    assert line == (f"plasmid: error: --config {tmp_path / 'run.json'}: task_apply_chat_template: expected true or "
                    f"false, got 'maybe'")
    assert not (tmp_path / "run").exists()


def test_the_quickstart_with_its_recipe_model_is_not_warned_about_a_chat_template(capsys, tmp_path):
    assert main(["train", *FAST, "--run-dir", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "chat template" not in err and "dropped" not in err, "the recipe's tiny model is no instruct model"
