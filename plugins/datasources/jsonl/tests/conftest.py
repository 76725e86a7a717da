"""Models and data files shared by the jsonl tests."""

import json
from pathlib import Path

import pytest
from plasmid_jsonl import plugin

from plasmid.testing import make_config
from plasmid_torch.tiny import DIGITS_ALPHABET, build_tiny_model

#: The example file shipped with the package: the 100 mod10 prompts.
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mod10.jsonl"
#: A chat template that renders "role:content|" per message and "assistant:" to generate.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}|{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture
def example_file():
    """The path of ``examples/mod10.jsonl``."""
    return str(EXAMPLE)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny model directory with the char tokenizer (digits and + = >)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    """A tiny model whose char tokenizer also spells roles, with :data:`CHAT_TEMPLATE`."""
    import transformers

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


@pytest.fixture
def jsonl_config(tmp_path, tiny_model):
    """``jsonl_config(**options)``: the configuration of a run that chose ``--datasource jsonl``."""

    def factory(**options):
        options = {"datasource": "jsonl", "model": tiny_model, "n_samples_per_prompt": 2, **options}
        return make_config(plugin, run_dir=tmp_path / "run", **options)

    return factory


@pytest.fixture
def write_jsonl(tmp_path):
    """``write_jsonl(name, rows)``: rows as a standard ``.jsonl`` file under ``tmp_path`` (one
    JSON object per line; what HF ``datasets`` reads); returns its path."""

    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        return str(path)

    return write


@pytest.fixture
def write_parquet(tmp_path):
    """``write_parquet(name, rows)``: rows as a standard ``.parquet`` file under ``tmp_path``
    (what HF ``datasets`` reads); returns its path."""
    import pyarrow
    import pyarrow.parquet

    def write(name, rows):
        path = tmp_path / name
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
        return str(path)

    return write
