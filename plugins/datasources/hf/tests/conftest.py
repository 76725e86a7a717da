"""The hf data source's tests run against the real ``datasets`` package (the ``environments`` tox
env installs it). Where plasmid-hf-datasets or datasets is not installed (the ``embedded`` env
collects every plugin's tests) the directory is skipped, unless ``PLASMID_REQUIRE_ENVIRONMENTS``
is set, where a missing package is a collection error instead."""

import importlib.util
import json
import os

import pytest

_installed = all(importlib.util.find_spec(name) is not None for name in ("plasmid_hf_datasets", "datasets"))
if not _installed:
    if os.environ.get("PLASMID_REQUIRE_ENVIRONMENTS"):
        raise ImportError("PLASMID_REQUIRE_ENVIRONMENTS is set but plasmid-hf-datasets or datasets is not "
                          "installed: pip install -r requirements/environments.txt")
    collect_ignore_glob = ["test_*.py"]

#: A chat template that renders "role:content|" per message and "assistant:" to generate.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")



@pytest.fixture
def verl_rows():
    """30 verl-style rows: the label nested in a struct column, metadata in another."""
    return [{"prompt": f"{a}+{b}=", "reward_model": {"ground_truth": str((a + b) % 10), "style": "rule"},
             "extra": {"a": a, "b": b}} for a in range(6) for b in range(5)]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny model directory with the char tokenizer (digits and + = >)."""
    from plasmid_torch.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    """A tiny model whose char tokenizer also spells roles, with :data:`CHAT_TEMPLATE`."""
    import transformers

    from plasmid_torch.tiny import DIGITS_ALPHABET, build_tiny_model

    directory = build_tiny_model(tmp_path_factory.mktemp("models") / "chat",
                                 alphabet=DIGITS_ALPHABET + "abcdefghijklmnopqrstuvwxyz:|")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    return str(directory)


@pytest.fixture(scope="session")
def vlm(tmp_path_factory):
    """The tiny Qwen2-VL (plasmid_torch.tiny_vision): a 32x32 image is 4 image tokens."""
    from plasmid_torch.tiny_vision import build_tiny_vlm

    return str(build_tiny_vlm(tmp_path_factory.mktemp("models") / "vlm"))


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """``datasets`` builds its arrow cache under ``tmp_path``, not the user's cache."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


@pytest.fixture
def write_jsonl(tmp_path):
    """``write_jsonl(name, rows)``: rows as a ``.jsonl`` file under ``tmp_path``; its path."""

    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        return str(path)

    return write


@pytest.fixture
def save_dataset(tmp_path):
    """``save_dataset(name, splits)``: ``{split: rows}`` saved with ``DatasetDict.save_to_disk``
    (or one ``Dataset`` when ``splits`` is a list of rows); its directory."""
    import datasets

    def save(name, splits):
        path = tmp_path / name
        if isinstance(splits, list):
            datasets.Dataset.from_list(splits).save_to_disk(str(path))
        else:
            datasets.DatasetDict({split: datasets.Dataset.from_list(rows)
                                  for split, rows in splits.items()}).save_to_disk(str(path))
        return str(path)

    return save
