"""``--model ORG/NAME``: a hub id in the local Hugging Face cache resolves to its snapshot
directory at start-up; one that is neither a directory nor cached (network not allowed, or the
download failing) is one ``plasmid: error:`` line naming it, before the run directory exists."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.errors import LocalEntryNotFoundError
from plasmid_hf.hub import looks_like_hub_id

from plasmid.app.cli import main
from plasmid.startup import start

REVISION = "0123456789abcdef0123456789abcdef01234567"
FAST = ["--num-rollouts", "1", "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
        "--save-interval", "0"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from plasmid_torch.tiny import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture
def hub_cache(tmp_path, tiny, monkeypatch) -> Path:
    """A Hugging Face cache laid out as huggingface_hub writes it, holding ``plasmid-test/tiny``
    (the quickstart's tiny model) at :data:`REVISION`; offline, as the test environment is."""
    cache = tmp_path / "hub"
    repo = cache / "models--plasmid-test--tiny"
    shutil.copytree(tiny, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str((a + 1) % 10)}) + "\n" for a in range(4)))
    return path


def train_fails(capsys, *args: str) -> str:
    code = main(["train", *FAST, *args])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("plasmid: error:")]
    assert code == 2, err
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_a_cached_hub_id_resolves_to_its_snapshot_directory(hub_cache, data, tmp_path):
    run_dir = tmp_path / "run"
    startup = start(["--model", "plasmid-test/tiny", "--datasource", "jsonl", "--prompt-data", str(data),
                     "--run-dir", str(run_dir)])
    assert startup.config.option.model == str(hub_cache / "models--plasmid-test--tiny" / "snapshots" / REVISION)
    assert not run_dir.exists()


@pytest.mark.timeout(300)
def test_a_run_trains_from_a_cached_hub_id(hub_cache, data, tmp_path):
    run_dir = tmp_path / "run"
    code = main(["train", *FAST, "--model", "plasmid-test/tiny", "--datasource", "jsonl", "--prompt-data", str(data),
                 "--run-dir", str(run_dir)])
    assert code == 0
    assert (run_dir / "metrics.jsonl").is_file()


def test_an_uncached_hub_id_offline_is_one_line_naming_it(capsys, hub_cache, data, tmp_path):
    run_dir = tmp_path / "run"
    line = train_fails(capsys, "--model", "plasmid-test/absent", "--datasource", "jsonl", "--prompt-data", str(data),
                       "--run-dir", str(run_dir))
    assert line.startswith(f"plasmid: error: --model plasmid-test/absent: not a directory, and not in the Hugging "
                           f"Face cache {hub_cache} (HF_HUB_OFFLINE=1: no download)"), line
    assert not run_dir.exists()


def test_a_cached_id_without_a_snapshot_for_its_ref_is_not_cached(capsys, hub_cache, data, tmp_path):
    (hub_cache / "models--plasmid-test--tiny" / "refs" / "main").write_text("f" * 40)
    line = train_fails(capsys, "--model", "plasmid-test/tiny", "--datasource", "jsonl", "--prompt-data", str(data),
                       "--run-dir", str(tmp_path / "run"))
    assert "--model plasmid-test/tiny: not a directory, and not in the Hugging Face cache" in line


def test_with_the_network_allowed_the_id_is_downloaded(monkeypatch, hub_cache, tiny, data, tmp_path):
    calls = []

    def download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tiny)

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    startup = start(["--model", "org/fresh", "--datasource", "jsonl", "--prompt-data", str(data),
                     "--run-dir", str(tmp_path / "run")])
    assert startup.config.option.model == str(tiny)
    assert calls == [("org/fresh", {"cache_dir": str(hub_cache), "local_files_only": False})]


def test_a_failed_download_is_one_line_naming_the_id(capsys, monkeypatch, hub_cache, data, tmp_path):
    def download(repo_id, **kwargs):
        raise LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub.\nConnection "
                                      "refused")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    line = train_fails(capsys, "--model", "org/fresh", "--datasource", "jsonl", "--prompt-data", str(data),
                       "--run-dir", str(tmp_path / "run"))
    assert line.startswith("plasmid: error: --model org/fresh: not a directory, not in the Hugging Face cache")
    assert "could not be downloaded (LocalEntryNotFoundError: An error happened" in line
    assert "Connection refused" in line
    assert not (tmp_path / "run").exists()


def test_paths_are_left_to_the_kernels_directory_check(capsys, hub_cache, tmp_path):
    assert looks_like_hub_id("Qwen/Qwen2.5-0.5B") and looks_like_hub_id("gpt2")
    (tmp_path / "exists").mkdir()
    for path in ("./model", "/abs/model", "~/model", "runs/x/model", str(tmp_path / "exists"), "a--b/c", ""):
        assert not looks_like_hub_id(path), path
    line = train_fails(capsys, "--model", "runs/x/model", "--run-dir", str(tmp_path / "run"))
    assert line == "plasmid: error: --model runs/x/model: no such directory (give a local Hugging Face model directory)"
