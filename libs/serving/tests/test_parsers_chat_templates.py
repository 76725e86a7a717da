"""Round trips through Hugging Face chat templates: an assistant message with ``tool_calls`` (and
reasoning) is rendered by a template written as that model family's renders calls, the rendered
text is encoded and decoded by a real ``PreTrainedTokenizerFast`` made in code, and the family's
parser reads back the same calls (names and decoded arguments, in order) and content."""

from __future__ import annotations

import json

import pytest

from plasmid_serving.parsers import REASONING_PARSERS, TOOL_PARSERS, parse_message

pytest.importorskip("transformers")
tiny = pytest.importorskip("plasmid_torch.tiny")

#: Qwen2.5's rendering of calls (hermes): one tagged JSON object per call, arguments as JSON.
QWEN25 = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}{%- set f = tc.function %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + f.name + '\", \"arguments\": ' + f.arguments | tojson + '}\n</tool_call>' }}"
    "{%- endfor %}<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Qwen3's: the reasoning of the last assistant turn inside <think>, then content and tagged calls.
QWEN3 = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}{{ '<think>\n' + m.reasoning_content + '\n</think>\n\n' }}{% endif %}"
    "{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}{%- set f = tc.function %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + f.name + '\", \"arguments\": ' + f.arguments | tojson + '}\n</tool_call>' }}"
    "{%- endfor %}<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Llama 3.1's: the (single) call as {"name": ..., "parameters": ...}, then <|eot_id|>.
LLAMA31 = (
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if m.tool_calls %}{%- set f = m.tool_calls[0].function %}"
    "{{- '{\"name\": \"' + f.name + '\", ' }}{{- '\"parameters\": ' }}{{- f.arguments | tojson }}{{- '}' }}"
    "{%- else %}{{ m.content }}{%- endif %}<|eot_id|>{% endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

#: Mistral v3 tokenizers' (Mistral-7B-Instruct-v0.3): one [TOOL_CALLS] JSON list, each with a 9-character id.
MISTRAL_V3 = (
    "<s>{%- for m in messages %}{%- if m.role == 'user' %}[INST] {{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}[TOOL_CALLS] ["
    "{%- for tc in m.tool_calls %}{%- set out = tc.function | tojson %}{{- out[:-1] }}"
    "{{- ', \"id\": \"' + tc.id + '\"}' }}{%- if not loop.last %}, {% else %}]</s>{% endif %}{%- endfor %}"
    "{%- else %}{{ m.content }}</s>{%- endif %}{%- endfor %}"
)

#: Mistral v11+ tokenizers' (Mistral Small 3.2, Magistral): [TOOL_CALLS]NAME[ARGS]{...} per call.
MISTRAL_V11 = (
    "<s>{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- else %}{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}[TOOL_CALLS]{{ tc.function.name }}[ARGS]{{ tc.function.arguments | tojson }}"
    "{%- endfor %}</s>{%- endif %}{%- endfor %}"
)

#: DeepSeek-V3's: a calls block, each call TYPE<sep>NAME and its arguments (a JSON string) in a json fence.
DEEPSEEK_V3 = (
    "<｜begin▁of▁sentence｜>{%- for m in messages %}{%- if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{%- else %}<｜Assistant｜>{{ m.content or '' }}<｜tool▁calls▁begin｜>"
    "{%- for tc in m.tool_calls %}{{ '<｜tool▁call▁begin｜>' + tc.type + '<｜tool▁sep｜>' + tc.function.name + '\n'"
    " + '```json' + '\n' + tc.function.arguments + '\n' + '```' + '<｜tool▁call▁end｜>' }}{%- endfor %}"
    "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<｜Assistant｜>{% endif %}"
)

#: Qwen3-Coder's: XML calls; a mapping or list value as JSON, anything else as its text.
QWEN3_CODER = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] %}{%- set f = tc.function %}"
    "{{- '\n<tool_call>\n<function=' + f.name + '>\n' }}"
    "{%- for key, value in f.arguments | items %}{{- '<parameter=' + key + '>\n' }}"
    "{%- if value is mapping or (value is sequence and value is not string) %}{{- value | tojson }}"
    "{%- else %}{{- value | string }}{%- endif %}{{- '\n</parameter>\n' }}{%- endfor %}"
    "{{- '</function>\n</tool_call>' }}{%- endfor %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Llama 3.2's pythonic calls: [name(key=value, ...), ...].
PYTHONIC = (
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if m.tool_calls %}[{%- for tc in m.tool_calls %}{{ tc.function.name }}("
    "{%- for key, value in tc.function.arguments | items %}{{ key }}={{ value | tojson }}"
    "{%- if not loop.last %}, {% endif %}{%- endfor %}){%- if not loop.last %}, {% endif %}{%- endfor %}]"
    "{%- else %}{{ m.content }}{%- endif %}<|eot_id|>{% endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

WEATHER = {"city": "Zürich", "days": 3, "units": ["C", "mm"]}
SEARCH = {"query": "tool \"calls\"\nin <b>text</b>", "filters": {"year": 2024, "open": True}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
             "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "array"}}}}},
         {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
             "query": {"type": "string"}, "filters": {"type": "object"}}}}}]


def calls(*named, string_arguments=False):
    return [{"id": f"call{i:05d}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args) if string_arguments else args}}
            for i, (name, args) in enumerate(named)]


TWO_CALLS = (("get_weather", WEATHER), ("search", SEARCH))

# parser, template, the assistant message, the end of its turn, the content read back
CASES = {
    "hermes": ("hermes", QWEN25, {"content": "Checking.", "tool_calls": calls(*TWO_CALLS)}, "<|im_end|>\n",
               "Checking."),
    "qwen25": ("qwen25", QWEN25, {"content": "", "tool_calls": calls(*TWO_CALLS)}, "<|im_end|>\n", None),
    "llama3_json": ("llama3_json", LLAMA31, {"content": "", "tool_calls": calls(TWO_CALLS[0])}, "<|eot_id|>", None),
    "mistral-v3": ("mistral", MISTRAL_V3, {"content": "", "tool_calls": calls(*TWO_CALLS)}, "</s>", None),
    "mistral-v11": ("mistral", MISTRAL_V11, {"content": "Let me look.", "tool_calls": calls(*TWO_CALLS)}, "</s>",
                    "Let me look."),
    "deepseek_v3": ("deepseek_v3", DEEPSEEK_V3,
                    {"content": "", "tool_calls": calls(*TWO_CALLS, string_arguments=True)},
                    "<｜end▁of▁sentence｜>", None),
    "qwen3_coder": ("qwen3_coder", QWEN3_CODER, {"content": "Sure.", "tool_calls": calls(*TWO_CALLS)}, "<|im_end|>\n",
                    "Sure."),
    "pythonic": ("pythonic", PYTHONIC, {"content": "", "tool_calls": calls(("get_weather", WEATHER),
                                                                            ("search", {"query": "a, b]"}))},
                 "<|eot_id|>", None),
}


def tokenizer_with(template: str, text: str):
    """A real fast tokenizer, one token per character of ``text`` (and ASCII), with ``template``."""
    alphabet = "".join(dict.fromkeys("".join(chr(c) for c in range(32, 127)) + "\n" + text))
    tokenizer = tiny.char_tokenizer(alphabet, max_length=1 << 16, chat_template=False)
    tokenizer.chat_template = template
    return tokenizer


def assistant_text(template: str, message: dict, end: str) -> tuple[list[int], str]:
    """The assistant turn's token ids and their decoded text (its end-of-turn marker removed)."""
    user = [{"role": "user", "content": "What's up?"}]
    draft = tokenizer_with(template, "")
    full = draft.apply_chat_template([*user, {"role": "assistant", **message}], tools=TOOLS, tokenize=False)
    prompt = draft.apply_chat_template(user, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert full.startswith(prompt) and full.endswith(end), (prompt, full)
    tokenizer = tokenizer_with(template, full)
    ids = tokenizer.encode(full[len(prompt):-len(end)], add_special_tokens=False)
    return ids, tokenizer.decode(ids)


@pytest.mark.parametrize("case", sorted(CASES))
def test_calls_rendered_by_the_family_template_parse_back_to_the_same_calls(case):
    name, template, message, end, content = CASES[case]
    ids, text = assistant_text(template, message, end)
    before = list(ids)
    got_content, got_calls = TOOL_PARSERS.get(name).parse(text, TOOLS)

    expected = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    expected = [(n, json.loads(a) if isinstance(a, str) else a) for n, a in expected]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got_calls] == expected
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got_calls)
    assert got_content == content
    assert ids == before  # parsing reads the text; the token ids are untouched


def test_qwen3_reasoning_and_calls_parse_back_from_the_template():
    message = {"reasoning_content": "The user wants weather.\nUse the tool.", "content": "On it.",
               "tool_calls": calls(TWO_CALLS[0])}
    _, text = assistant_text(QWEN3, message, "<|im_end|>\n")
    parsed = parse_message(text, TOOL_PARSERS.get("hermes"), REASONING_PARSERS.get("qwen3"), TOOLS)
    assert parsed.reasoning == "The user wants weather.\nUse the tool."
    assert parsed.content == "On it."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        ("get_weather", WEATHER)]


def test_qwen3_coder_values_are_typed_by_the_tool_schema():
    _, text = assistant_text(QWEN3_CODER, {"content": "", "tool_calls": calls(("get_weather", {
        "city": "42", "days": 7, "units": ["C"]}))}, "<|im_end|>\n")
    (call,) = TOOL_PARSERS.get("qwen3_coder").parse(text, TOOLS)[1]
    assert json.loads(call["function"]["arguments"]) == {"city": "42", "days": 7, "units": ["C"]}
    (untyped,) = TOOL_PARSERS.get("qwen3_coder").parse(text)[1]  # no schema: JSON where the text is JSON
    assert json.loads(untyped["function"]["arguments"]) == {"city": 42, "days": 7, "units": ["C"]}


# ---------------------------------------------------------------------------------- gpt-oss (harmony)
HARMONY_SPECIAL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]

#: gpt-oss's rendering, written small: an assistant's thinking as an analysis message, each call a
#: commentary message to=functions.NAME closed by <|call|>, content a final message, tool answers as
#: messages from functions.NAME; the generation prompt is <|start|>assistant.
GPT_OSS = (
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}<|start|>user<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'tool' %}<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary<|message|>"
    "{{ m.content | tojson }}<|end|>"
    "{%- else %}{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif %}"
    "{%- for tc in m.tool_calls or [] %}<|start|>assistant to=functions.{{ tc.function.name }}<|channel|>commentary "
    "json<|message|>{{ tc.function.arguments | tojson }}<|call|>{%- endfor %}"
    "{%- if m.content %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}"
    "{{ '<|return|>' if loop.last else '<|end|>' }}{%- endif %}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)


def harmony_tokenizer(text: str):
    """The character tokenizer of :func:`tokenizer_with` with harmony's markers as special tokens."""
    tokenizer = tokenizer_with(GPT_OSS, text)
    tokenizer.add_special_tokens({"additional_special_tokens": HARMONY_SPECIAL})
    return tokenizer


def harmony_turn(message: dict) -> tuple[object, list[int], str]:
    """The tokenizer, the assistant turn's ids as gpt-oss writes them (its closing marker kept: the
    engine returns it) and their text decoded with the special tokens kept."""
    user = [{"role": "user", "content": "Weather in Zürich?"}]
    draft = harmony_tokenizer("")
    full = draft.apply_chat_template([*user, {"role": "assistant", **message}], tools=TOOLS, tokenize=False)
    prompt = draft.apply_chat_template(user, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert full.startswith(prompt), (prompt, full)
    tokenizer = harmony_tokenizer(full)
    ids = tokenizer.encode(full[len(prompt):], add_special_tokens=False)
    return tokenizer, ids, tokenizer.decode(ids, skip_special_tokens=False)


def test_gpt_oss_calls_and_reasoning_parse_back_from_the_template_tokens_exact():
    message = {"thinking": "Need the weather tool.", "content": "",
               "tool_calls": calls(("get_weather", WEATHER))}
    tokenizer, ids, text = harmony_turn(message)
    before = list(ids)
    assert tokenizer.convert_tokens_to_ids("<|call|>") == ids[-1]  # one special token each
    assert "<|channel|>" not in tokenizer.decode(ids, skip_special_tokens=True)  # why the gateway keeps them
    parsed = parse_message(text, TOOL_PARSERS.get("openai"), REASONING_PARSERS.get("openai_gptoss"), TOOLS)
    assert parsed.reasoning == "Need the weather tool."
    assert parsed.content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        ("get_weather", WEATHER)]
    assert ids == before and tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.encode(text, add_special_tokens=False) == ids  # the text round-trips to the same ids


def test_gpt_oss_final_answer_is_the_content_and_analysis_the_reasoning():
    _, _, text = harmony_turn({"thinking": "Easy.", "content": "It is 12 °C."})
    parsed = parse_message(text, TOOL_PARSERS.get("openai"), REASONING_PARSERS.get("openai_gptoss"), TOOLS)
    assert (parsed.reasoning, parsed.tool_calls) == ("Easy.", [])
    assert parsed.content == "It is 12 °C.<|return|>"  # the closer is a special token: the gateway drops it
    content, found = TOOL_PARSERS.get("gpt-oss").parse(text, TOOLS)  # without a reasoning parser
    assert (content, found) == ("It is 12 °C.", [])
