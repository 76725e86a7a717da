"""Fixtures the multiturn tests share: a real Hugging Face tokenizer with a chat template that
renders tools, for ``--tool-call-format chat-template``."""

from __future__ import annotations

import json
import string

import pytest

#: A Qwen-like chat template (built in code, no hub) that lists the tools' names and renders tool
#: answers as ``<tool_response>`` user turns; ``REWRITE`` is removed from earlier assistant turns
#: (``"\x00"``: nothing, as most templates do; a reasoning stripper removes its thinking), and
#: ``TOOL_CHECK`` is where a tool message may be rejected.
TEMPLATE = (
    "{%- if tools %}<|im_start|>system tools: {{ tools | map(attribute='function') | map(attribute='name') "
    "| join(',') }}<|im_end|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}TOOL_CHECK<|im_start|>user <tool_response>{{ m.content }}</tool_response><|im_end|>"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant {{ m.content | replace(REWRITE, '') }}<|im_end|>"
    "{%- else %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)

#: What a template that demands OpenAI-style tool messages does with one without ``tool_call_id``.
REQUIRE_TOOL_CALL_ID = ("{%- if m.tool_call_id is not defined %}{{ raise_exception('tool messages need a "
                        "tool_call_id') }}{%- endif %}")


@pytest.fixture
def chat_tokenizer():
    """``chat_tokenizer(rewrite="\\x00", require_tool_call_id=False)``: the tiny char tokenizer
    (``plasmid_torch.tiny``) over printable ASCII, with ``<|im_start|>`` and ``<|im_end|>`` as
    special tokens and :data:`TEMPLATE` as its chat template; with ``require_tool_call_id`` it
    raises on a tool message without a ``tool_call_id`` (:data:`REQUIRE_TOOL_CALL_ID`)."""
    pytest.importorskip("transformers")
    from plasmid_torch.tiny import char_tokenizer

    def make(rewrite: str = "\x00", require_tool_call_id: bool = False):
        alphabet = "".join(c for c in string.printable if c not in "\n\r\t\x0b\x0c")
        tok = char_tokenizer(alphabet, max_length=4096)
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tok.chat_template = TEMPLATE.replace("REWRITE", json.dumps(rewrite)).replace(
            "TOOL_CHECK", REQUIRE_TOOL_CALL_ID if require_tool_call_id else "")
        return tok

    return make
