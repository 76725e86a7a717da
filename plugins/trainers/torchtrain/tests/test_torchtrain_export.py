"""``plasmid export`` (:mod:`plasmid_torchtrain.export`, issue 35): real runs of a tiny model, 2 steps of
``--loss sft`` (so the weights move) with ``plasmid train``, exported and loaded back with transformers and
peft; the model card; the refusals; ``--push-to-hub`` up to the ``HfApi`` calls (patched: no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from plasmid_e2e import read_metrics, run_plasmid

from plasmid.app.cli import main

TINY = ["--seed", "0", "--loss", "sft", "--lr", "1e-2", "--num-rollouts", "2", "--prompts-per-step", "2",
        "--n-samples-per-prompt", "2", "--eval-interval", "0", "--save-interval", "0"]
IDS = torch.tensor([[1, 3, 4, 5, 6, 7]])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A full run (the quickstart's tiny model, sampling at temperature 0.7, top-k 5) and a LoRA run on
    the full run's base model, each 2 steps."""
    root = tmp_path_factory.mktemp("export")
    full = root / "full"
    done = run_plasmid("train", *TINY, "--temperature", "0.7", "--top-k", "5", "--run-dir", str(full))
    assert done.returncode == 0, done.stderr[-2000:]
    lora = root / "lora"
    done = run_plasmid("train", *TINY, "--model", str(full / "model"), "--lora-rank", "4", "--run-dir", str(lora))
    assert done.returncode == 0, done.stderr[-2000:]
    return {"full": full, "lora": lora, "base": full / "model", "root": root}


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def export(*argv: str) -> int:
    return main(["export", *map(str, argv)])


def test_full_run_exports_a_model_that_loads_with_the_checkpoints_logits(runs, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = tmp_path / "pub" / "tiny-sft"
    assert export(runs["full"], out) == 0          # the run directory: its newest checkpoint
    checkpoint = runs["full"] / "checkpoints" / "step_000001" / "trainer" / "model"
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(logits(exported), logits(AutoModelForCausalLM.from_pretrained(checkpoint)))
    assert not torch.allclose(logits(exported), logits(AutoModelForCausalLM.from_pretrained(runs["base"])))
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(checkpoint).chat_template
    assert json.loads((out / "config.json").read_text()) == json.loads((checkpoint / "config.json").read_text())
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.do_sample, generation.temperature, generation.top_k, generation.top_p) == (True, 0.7, 5, 1.0)
    assert generation.eos_token_id == GenerationConfig.from_pretrained(checkpoint).eos_token_id
    assert not list(out.parent.glob(".tiny-sft.*"))     # no staging directory left

    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and "- sft\n" in card
    assert "# tiny-sft" in card and 'AutoModelForCausalLM.from_pretrained("tiny-sft")' in card
    assert "| `--temperature` | `0.7` | plasmid |" in card and "| `--top-k` | `5` | plasmid |" in card
    assert "| `--lr` | `0.01` | torchtrain |" in card
    assert "--run-dir" not in card and "| `--top-p`" not in card     # where it wrote; defaults
    last = read_metrics(runs["full"])[-1]
    assert last["step"] == 1 and f"| `train/loss` | {last['train/loss']:.6g} |" in card
    assert "| torchtrain | plasmid-torchtrain | 0.1.0 | trainer: torchtrain |" in card
    assert "| sft | plasmid-sft |" in card and "| megatron |" not in card   # used plugins only
    record = json.loads((out / "plasmid_run.json").read_text())
    assert record["step"] == 1 and record["config"]["option"]["top_k"] == 5 and record["plugin_lock"]

    # OUT is now a non-empty model directory: refused without --force, replaced with it
    capsys.readouterr()
    assert export(runs["full"] / "checkpoints" / "step_000001", out) == 2
    assert capsys.readouterr().err == (f"plasmid: error: OUT {out} exists and is not empty; --force replaces it, or "
                                       f"choose another OUT\n")
    (out / "stale.txt").write_text("old")
    assert export(runs["full"] / "checkpoints" / "step_000001", out, "--force") == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()


def test_lora_run_exports_merged_weights_and_adapters(runs, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged, adapters = tmp_path / "merged", tmp_path / "adapters"
    assert export(runs["lora"], merged) == 0
    assert export(runs["lora"] / "checkpoints" / "step_000001", adapters, "--adapters-only") == 0
    step = runs["lora"] / "checkpoints" / "step_000001" / "trainer"
    base_logits = logits(AutoModelForCausalLM.from_pretrained(runs["base"]))
    merged_logits = logits(AutoModelForCausalLM.from_pretrained(merged))
    assert torch.equal(merged_logits, logits(AutoModelForCausalLM.from_pretrained(step / "model")))
    assert not torch.allclose(merged_logits, base_logits)           # the adapters trained and were merged
    assert not list(merged.glob("adapter_*"))

    assert sorted(p.name for p in adapters.iterdir() if "token" not in p.name) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors", "chat_template.jinja",
        "generation_config.json", "plasmid_run.json"]
    on_base = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(runs["base"]), adapters)
    torch.testing.assert_close(logits(on_base), merged_logits, rtol=1e-5, atol=1e-5)
    card = (adapters / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: peft\n") and "- lora\n" in card and "PeftModel.from_pretrained" in card
    assert "| `--lora-rank` | `4` | torchtrain |" in card


def test_bad_inputs_are_one_line_exit_2_and_write_nothing(runs, tmp_path, capsys):
    out = tmp_path / "out"
    cases = {
        (tmp_path / "nope",): f"CHECKPOINT {tmp_path / 'nope'}: no such directory",
        (runs["full"] / "model",): f"CHECKPOINT {runs['full'] / 'model'} is not a complete plasmid checkpoint",
        (runs["full"], "--adapters-only"): "--adapters-only: checkpoint ",
        (runs["full"], "--push-to-hub", "not a repo"): "--push-to-hub not a repo: not a repository id",
    }
    empty_run = tmp_path / "empty-run"
    (empty_run / "checkpoints").mkdir(parents=True)
    cases[(empty_run,)] = f"CHECKPOINT {empty_run}: the run directory holds no complete checkpoint"
    # a checkpoint of a trainer whose format plasmid export does not read
    foreign = tmp_path / "foreign"
    step = foreign / "checkpoints" / "step_000003"
    (step / "trainer").mkdir(parents=True)
    (step / "trainer" / "weights.bin").write_bytes(b"\0")
    (step / "meta.json").write_text(json.dumps({"rollout_id": 3}))
    (foreign / "config.json").write_text(json.dumps({"option": {"trainer": "jaxtrain"}, "plugin_lock": []}))
    cases[(step,)] = f"CHECKPOINT {step}: the format of trainer 'jaxtrain' (the run's config.json) is not understood"
    for (checkpoint, *options), expected in cases.items():
        capsys.readouterr()
        assert export(checkpoint, out, *options) == 2, expected
        err = capsys.readouterr().err
        assert err.startswith(f"plasmid: error: {expected}") and err.count("\n") == 1, err
        assert not out.exists()

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    assert export(runs["full"], occupied, "--force") == 2          # --force replaces only a model directory
    assert "is not a model directory" in capsys.readouterr().err
    assert [p.name for p in occupied.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty-run", "foreign", "occupied"]   # no staging left


def test_the_command_is_registered_and_an_interrupted_export_leaves_nothing(runs, tmp_path, monkeypatch):
    from plasmid_torchtrain import export as module

    done = run_plasmid("export", str(tmp_path / "missing"), str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr == f"plasmid: error: CHECKPOINT {tmp_path / 'missing'}: no such directory\n"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(module, "model_card", interrupted)   # after the weights were copied into staging
    with pytest.raises(KeyboardInterrupt):
        module.export(module.resolve(runs["full"]), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_push_to_hub_creates_the_repo_and_uploads_the_directory(runs, tmp_path, monkeypatch, capsys):
    from huggingface_hub import HfApi, constants

    calls = []
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, **kw: calls.append(("create_repo", kw)) or
                        "https://huggingface.co/me/tiny")

    def upload_folder(self, **kw):
        calls.append(("upload_folder", {**kw, "files": sorted(p.name for p in Path(kw["folder_path"]).iterdir())}))
        return "https://huggingface.co/me/tiny/commit/abc"

    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    out = tmp_path / "tiny"
    assert export(runs["full"], out, "--push-to-hub", "me/tiny", "--private") == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"pushed {out} to https://huggingface.co/me/tiny/commit/abc"
    [(create, created), (upload, uploaded)] = calls
    assert (create, created) == ("create_repo", {"repo_id": "me/tiny", "repo_type": "model", "private": True,
                                                  "exist_ok": True})
    assert upload == "upload_folder" and uploaded["repo_id"] == "me/tiny" and uploaded["repo_type"] == "model"
    assert uploaded["folder_path"] == str(out) and "README.md" in uploaded["files"]
    assert "model.safetensors" in uploaded["files"] and uploaded["commit_message"] == "plasmid export of full step 1"

    def failing(self, **kw):
        raise OSError("503 Service Unavailable\nmore")

    monkeypatch.setattr(HfApi, "upload_folder", failing)
    again = tmp_path / "again"
    assert export(runs["full"], again, "--push-to-hub", "me/tiny") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pushing" in err and "503 Service Unavailable" in err
    assert (again / "config.json").is_file()     # the export itself is complete

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert export(runs["full"], tmp_path / "offline", "--push-to-hub", "me/tiny") == 2
    assert "HF_HUB_OFFLINE is set" in capsys.readouterr().err and not (tmp_path / "offline").exists()


def test_a_megatron_layout_checkpoint_exports_its_model_directory(runs, tmp_path, capsys):
    """megatron's checkpoints keep a complete HF ``model/`` beside ``dist/`` (no trainer_state.pt, no LoRA)."""
    import shutil

    run = tmp_path / "mrun"
    step = run / "checkpoints" / "step_000001"
    shutil.copytree(runs["full"] / "checkpoints" / "step_000001", step)
    (step / "trainer" / "trainer_state.pt").unlink()
    (step / "trainer" / "dist").mkdir()
    shutil.copy(runs["full"] / "config.json", run / "config.json")
    assert export(run, tmp_path / "out", "--adapters-only") == 2
    assert "holds no LoRA adapters (megatron checkpoint" in capsys.readouterr().err
    assert export(run, tmp_path / "out") == 0
    assert "(step 1, megatron)" in capsys.readouterr().out
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (step / "trainer" / "model" /
                                                                     "model.safetensors").read_bytes()
    assert json.loads((tmp_path / "out" / "plasmid_run.json").read_text())["trainer"] == "megatron"
