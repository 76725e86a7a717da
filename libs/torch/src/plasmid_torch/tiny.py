"""Tiny causal LMs built from a config, with a character-level tokenizer made in code.

No hub: the quickstart recipe and every test model come from here, saved in Hugging Face
format (``save_pretrained``) and loaded back with ``AutoModelForCausalLM`` / ``AutoTokenizer``.
Imports torch and transformers when called, not when imported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
#: The quickstart alphabet: digits and the operators of the built-in tasks.
DIGITS_ALPHABET = "0123456789+=>"

#: The char tokenizer's chat template (``tokenizer.chat_template``). Its vocabulary has no letters
#: to spell roles with, so turns are told apart by the special tokens: a ``system``, ``user`` or
#: ``tool`` message is ``<bos>`` + its content, an ``assistant`` message is its content + ``<eos>``
#: (the engine stops on ``<eos>``, so a reply ends as the model ended it), and the generation prompt
#: is empty: the quickstart's prompts end in their cue (``=``, ``>``). So one user message renders
#: to exactly the quickstart's prompt ids (``<bos>`` + one id per character), and each turn of a
#: conversation extends the previous turns' ids. Any other role is an error.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ message['content'] or '' }}{{ eos_token }}"
    "{%- elif message['role'] in ['system', 'user', 'tool'] -%}"
    "{{ bos_token }}{{ message['content'] or '' }}"
    "{%- else -%}"
    "{{ raise_exception('the char tokenizer\\'s chat template has no role ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{%- endif -%}"
)


def char_tokenizer(alphabet: str = DIGITS_ALPHABET, max_length: int = 64, chat_template: bool = True) -> Any:
    """A ``PreTrainedTokenizerFast`` with one token per character of ``alphabet``.

    Ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, then ``alphabet`` in order. Encoding prepends
    ``<bos>``; decoding joins characters without spaces. With ``chat_template`` (the default) it
    has :data:`CHAT_TEMPLATE`; the ids are the same either way.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({char: len(SPECIAL_TOKENS) + i for i, char in enumerate(alphabet)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    # one piece per code point: "." would leave a run of newlines as one piece, which has no id
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                        special_tokens=[("<bos>", BOS_ID)])
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                        padding_side="left", model_max_length=max_length)
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


#: Positions of a tiny model unless given: room for a short prompt and the default --max-new-tokens
#: (64), which start-up checks against the model's context. The quickstart recipe asks for 64.
#: (Rotary position embeddings do not depend on it: the weights are the same for any value.)
TINY_POSITIONS = 256

#: Extra config fields of the tiny mixture-of-experts architectures (besides the common ones).
TINY_MOE = {"num_experts": 4, "num_experts_per_tok": 2}


def tiny_config(vocab_size: int, arch: str = "qwen2", hidden_size: int = 64, num_layers: int = 2,
                num_heads: int = 4, num_kv_heads: int | None = None, max_positions: int = TINY_POSITIONS,
                tie_word_embeddings: bool = True, **overrides: Any) -> Any:
    """A Hugging Face config for a tiny ``arch`` model; FFN is 4x hidden; ``max_positions``
    (:data:`TINY_POSITIONS` unless given) positions.

    ``arch``: ``qwen2``, ``llama``, ``qwen3`` (head_dim hidden / heads), or the mixture-of-experts
    ``qwen2_moe`` / ``qwen3_moe`` (:data:`TINY_MOE`: 4 experts of width hidden / 2, top-2, every layer
    sparse, ``norm_topk_prob`` transformers' default False; qwen2_moe adds a shared expert of width
    hidden). ``overrides`` are further config fields (e.g. ``norm_topk_prob=True``), applied last.
    """
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=num_heads,
                  num_key_value_heads=num_kv_heads or num_heads, max_position_embeddings=max_positions,
                  bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                  tie_word_embeddings=tie_word_embeddings)
    configs = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
               "qwen3": transformers.Qwen3Config, "qwen2_moe": transformers.Qwen2MoeConfig,
               "qwen3_moe": transformers.Qwen3MoeConfig}
    if arch not in configs:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {sorted(configs)}")
    if arch in ("qwen3", "qwen3_moe"):
        common["head_dim"] = hidden_size // num_heads
    if arch in ("qwen2_moe", "qwen3_moe"):
        common.update(TINY_MOE, moe_intermediate_size=hidden_size // 2)
    if arch == "qwen2_moe":
        common["shared_expert_intermediate_size"] = hidden_size
    return configs[arch](**{**common, **overrides})


def build_tiny_model(directory: str | os.PathLike[str], *, alphabet: str = DIGITS_ALPHABET, seed: int = 0,
                     arch: str = "qwen2", chat_template: bool = True, **config_kwargs: Any) -> Path:
    """Initialise a tiny causal LM with ``seed`` and save it with its tokenizer
    (:func:`char_tokenizer`, with its chat template unless ``chat_template`` is false, and the
    model's ``max_positions`` as its ``model_max_length``) to ``directory``.

    Written to a temporary sibling and renamed, so a half-written model is never seen.
    :returns: the directory.
    """
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    target = Path(directory)
    tokenizer = char_tokenizer(alphabet, max_length=config_kwargs.get("max_positions", TINY_POSITIONS),
                               chat_template=chat_template)
    config = tiny_config(len(tokenizer), arch=arch, **config_kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return save_model_dir(model, tokenizer, target)


def save_model_dir(model: Any, tokenizer: Any, directory: str | os.PathLike[str]) -> Path:
    """Write ``model`` and ``tokenizer`` as the Hugging Face directory ``directory``, whole or not
    at all: into a staging directory beside it, renamed into place (``FileExistsError`` if
    ``directory`` exists; never overwritten)."""
    target = Path(directory)
    staging = target.with_name(target.name + ".tmp")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        raise FileExistsError(f"{target} exists; not overwriting a model directory")
    staging.rename(target)
    return target
