"""Training and evaluation stop on the same ids: every end-of-sequence id of the model's
generation_config.json (Llama 3 style lists) and the tokenizer's, plus ``--stop-token-ids``.
A model whose every id is an end-of-sequence id answers each prompt with exactly one token."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
from plasmid_e2e import read_metrics, run_plasmid

from plasmid.session import build_inputs, build_rollout_context
from plasmid.startup import start


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from plasmid_torch.tiny import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0))


@pytest.fixture(scope="module")
def all_eos(model, tmp_path_factory) -> Path:
    """The tiny model with a generation_config.json that lists every id of its vocabulary as EOS."""
    directory = tmp_path_factory.mktemp("models") / "all-eos"
    shutil.copytree(model, directory)
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": list(range(vocab))}))
    return directory


def rows_file(tmp_path: Path) -> Path:
    rows = [{"prompt": f"{a}+{b}=", "label": str((a + b) % 10)} for a in range(3) for b in range(3)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_rollout_and_evaluation_sampling_share_the_stop_ids(tmp_path, all_eos):
    startup = start(["--datasource", "jsonl", "--model", str(all_eos), "--prompt-data", str(rows_file(tmp_path)),
                     "--apply-chat-template", "--stop-token-ids", "3", "--run-dir", str(tmp_path / "run")])
    build_inputs(startup)
    ctx = build_rollout_context(startup.config, startup.registry, prebuilt=startup.prebuilt)
    vocab = json.loads((all_eos / "config.json").read_text())["vocab_size"]
    assert ctx.sampling.stop_token_ids == (2, *[i for i in range(vocab) if i != 2]), "eos_token_id first"
    assert ctx.eval_sampling().stop_token_ids == ctx.sampling.stop_token_ids
    for engine in ctx.engines:
        asyncio.run(engine.shutdown())


def test_eval_stops_on_every_eos_id_of_the_generation_config(tmp_path, all_eos):
    result = run_plasmid("eval", "--model", str(all_eos), "--eval-data", f"rows={rows_file(tmp_path)}",
                         "--apply-chat-template", "--max-new-tokens", "6", "--eval-temperature", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads(result.stdout)["sets"]["rows"]
    assert (metrics["mean_length"], metrics["truncation_rate"]) == (1.0, 0.0)


def test_training_responses_end_at_the_stop_token_ids(tmp_path):
    every_id = ",".join(str(i) for i in range(16))  # the quickstart's char vocabulary has 16 ids
    result = run_plasmid("train", "--task", "reverse", "--num-rollouts", "1", "--prompts-per-step", "2",
                         "--n-samples-per-prompt", "2", "--eval-interval", "0", "--save-interval", "0",
                         "--stop-token-ids", every_id, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    [step] = read_metrics(tmp_path / "run")
    assert step["rollout/response_length_max"] == 1.0 and step["rollout/truncated_fraction"] == 0.0


def test_a_stop_token_id_past_the_vocabulary_writes_nothing(tmp_path, model):
    for args in (["--model", str(model)], []):  # a given model is checked at once; the recipe's once it is built
        run_dir = tmp_path / f"run{len(args)}"
        result = run_plasmid("train", *args, "--stop-token-ids", "2,16", "--run-dir", str(run_dir))
        assert result.returncode == 2 and result.stderr.count("plasmid: error:") == 1, result.stderr[-2000:]
        assert "--stop-token-ids: 16 is not a token id of the model at " in result.stderr
        assert "vocabulary has ids 0..15" in result.stderr and not run_dir.exists()


def test_a_stop_token_id_that_is_no_number_is_one_line(tmp_path):
    result = run_plasmid("train", "--stop-token-ids", "eos", "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "plasmid: error: --stop-token-ids eos: 'eos' is not a token id" in result.stderr
    assert not (tmp_path / "run").exists()
