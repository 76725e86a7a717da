"""plasmid-gguf's tests run where it and the packages of the GGUF load are installed (the ``realmodel`` tox env).

Where plasmid_gguf, gguf or accelerate is not installed (the ``embedded`` env collects every plugin's tests) the
directory is skipped, unless ``PLASMID_REQUIRE_REALMODEL`` is set (the ``realmodel`` env sets it), where a missing
package is a collection error instead.

The GGUF the tests convert is written here, with gguf's ``GGUFWriter``: a tiny Llama (two layers, a byte-level BPE
vocabulary of 262 tokens, a chat template) built from a seeded random Hugging Face model, its matrices quantised to
Q8_0 as llama.cpp's converter writes them (attention q/k rows permuted), so loading it exercises transformers' GGUF
dequantisation and the inverse permutation.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

NEEDED = ("plasmid_gguf", "gguf", "accelerate")
_missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if _missing:
    if os.environ.get("PLASMID_REQUIRE_REALMODEL"):
        raise ImportError(f"PLASMID_REQUIRE_REALMODEL is set but {', '.join(_missing)} is not installed: "
                          f"pip install -r requirements/realmodel.txt")
    collect_ignore_glob = ["test_*.py"]

#: The tiny GGUF's special tokens (ids 0, 1, 2), as SmolLM2's: eos and pad are ``<|im_end|>``.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_llama_gguf(path: Path, *, architecture: str = "llama", seed: int = 0):
    """Write a tiny Llama GGUF to ``path``; returns the Hugging Face model it was made from (float32,
    eval mode). ``architecture`` is written as ``general.architecture`` (another name makes a file
    transformers refuses)."""
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = SPECIAL_TOKENS + sorted(set(bytes_to_unicode().values())) + ["Ġt", "he", "Ġthe"]
    heads, kv_heads, head_dim, layers = 4, 2, 16, 2
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=heads * head_dim, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
                           + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue   # tied to the embedding: a GGUF stores it once
        weights = tensor.numpy()
        if name.endswith("q_proj.weight"):
            weights = _llama_cpp_permute(weights, heads)
        elif name.endswith("k_proj.weight"):
            weights = _llama_cpp_permute(weights, kv_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        if weights.ndim == 2:
            writer.add_tensor(gguf_name, gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _llama_cpp_permute(weights, heads: int):
    """The row order in which llama.cpp's convert_hf_to_gguf.py writes a q or k projection of
    ``heads`` heads (the rotary halves interleaved per head); transformers undoes it on load."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


@pytest.fixture(scope="session")
def write_gguf():
    """:func:`write_tiny_llama_gguf`, for a test that writes a GGUF of its own."""
    return write_tiny_llama_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """``(path, model)``: a tiny Llama GGUF (written once per session) and the float32 Hugging Face
    model it was quantised from."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf"
    model = write_tiny_llama_gguf(path)
    return path, model


@pytest.fixture(scope="session")
def gguf_loaded(tiny_gguf):
    """``(model, tokenizer)`` as transformers loads the tiny GGUF itself (the reference of the
    conversion: float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_gguf[0]
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
