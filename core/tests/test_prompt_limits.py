"""Context limits, read from a model directory's JSON alone: the run's --max-prompt-length and its
checks, the screen that drops or refuses overlong prompts, what start-up prints about them, and
the vLLM-worded error engines raise for a request past the context (no torch, no model loaded)."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest

from plasmid.errors import ContextLengthError, UsageError
from plasmid.model_limits import read_model_limits
from plasmid.prompt_limits import PromptLimit, PromptScreen, report_prompts
from plasmid.records import Record, RecordStream
from plasmid.testing import make_config


def model_dir(path: Path, config: dict | None = None, tokenizer: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config if config is not None else
                                                 {"max_position_embeddings": 64, "vocab_size": 16}))
    if tokenizer is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return path


# ------------------------------------------------------------------------------- the model's context
def test_the_context_is_max_position_embeddings_or_a_smaller_sane_tokenizer_limit(tmp_path):
    limits = read_model_limits(model_dir(tmp_path / "a", tokenizer={"model_max_length": 1e30}))
    assert (limits.context, limits.context_source, limits.vocab_size) == (
        64, "max_position_embeddings in config.json", 16)
    smaller = read_model_limits(model_dir(tmp_path / "b", tokenizer={"model_max_length": 32}))
    assert (smaller.context, smaller.context_source) == (32, "model_max_length in tokenizer_config.json")
    larger = read_model_limits(model_dir(tmp_path / "c", tokenizer={"model_max_length": 131072}))
    assert larger.context == 64


def test_other_config_keys_and_nested_text_configs_name_the_context(tmp_path):
    assert read_model_limits(model_dir(tmp_path / "gpt2", {"n_positions": 1024})).context == 1024
    nested = read_model_limits(model_dir(tmp_path / "vlm", {"text_config": {"max_position_embeddings": 8192,
                                                                              "vocab_size": 99}}))
    assert (nested.context, nested.vocab_size) == (8192, 99)
    assert nested.context_source == "max_position_embeddings in text_config of config.json"
    assert read_model_limits(model_dir(tmp_path / "none", {})).context is None
    assert read_model_limits(tmp_path / "missing").context is None


# ------------------------------------------------------------------------------- the run's limit
def test_the_default_limit_leaves_room_for_a_whole_response(tmp_path):
    limit = PromptLimit.of(make_config(model=str(model_dir(tmp_path / "m")), max_new_tokens=10))
    assert (limit.max_prompt_length, limit.overlong, limit.derived) == (54, "drop", True)
    assert limit.fits(54) and not limit.fits(55)
    assert limit.describe() == ("--max-prompt-length 54 (the model's context of 64 tokens minus --max-new-tokens "
                                "10)")


def test_a_given_limit_within_the_room_is_kept(tmp_path):
    limit = PromptLimit.of(make_config(model=str(model_dir(tmp_path / "m")), max_new_tokens=10,
                                       max_prompt_length=20, overlong_prompts="error"))
    assert (limit.max_prompt_length, limit.overlong, limit.derived) == (20, "error", False)
    assert limit.describe() == "--max-prompt-length 20"


def test_a_model_that_names_no_context_has_no_default_limit(tmp_path):
    config = make_config(model=str(model_dir(tmp_path / "m", {})), max_new_tokens=5000)
    assert PromptLimit.of(config).max_prompt_length is None and PromptLimit.of(config).fits(10**6)
    given = make_config(model=str(model_dir(tmp_path / "m", {})), max_prompt_length=7)
    assert PromptLimit.of(given).max_prompt_length == 7


def test_max_new_tokens_that_fill_the_context_are_a_one_line_usage_error(tmp_path):
    model = model_dir(tmp_path / "m")
    with pytest.raises(UsageError) as raised:
        PromptLimit.of(make_config(model=str(model), max_new_tokens=100))
    assert str(raised.value) == (
        f"--max-new-tokens 100: the model at {model} has a context of 64 tokens (max_position_embeddings in "
        f"config.json), so a response of 100 tokens leaves no room for a prompt; lower --max-new-tokens (at most 63)")
    with pytest.raises(UsageError, match="^--max-new-tokens 64: "):
        PromptLimit.of(make_config(model=str(model), max_new_tokens=64))


def test_a_max_prompt_length_past_the_room_left_is_a_one_line_usage_error(tmp_path):
    model = model_dir(tmp_path / "m")
    with pytest.raises(UsageError) as raised:
        PromptLimit.of(make_config(model=str(model), max_new_tokens=10, max_prompt_length=60))
    assert str(raised.value) == (
        f"--max-prompt-length 60: a prompt of 60 tokens and a response of --max-new-tokens 10 need 70 positions, but "
        f"the model at {model} has a context of 64 tokens (max_position_embeddings in config.json); give at most 54, "
        f"or lower --max-new-tokens")


@pytest.mark.parametrize(("bad", "message"), [
    ({"max_prompt_length": 0}, "--max-prompt-length 0: must be >= 1"),
    ({"max_prompt_length": "long"}, "--max-prompt-length: expected int, got 'long'"),
    ({"overlong_prompts": "truncate"}, "--overlong-prompts 'truncate': choose one of drop, error"),
])
def test_bad_values_of_the_new_options_are_one_line_usage_errors(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(**bad)
    assert str(raised.value) == message


# ------------------------------------------------------------------------------- the screen
def rows(*lengths: int) -> list[Record]:
    return [Record(prompt="x" * length, label=None, location=f"rows.jsonl:{number}")
            for number, length in enumerate(lengths, start=1)]


def stream(train: list[Record], limit: PromptLimit, eval_records: list[Record] = ()) -> RecordStream:
    return RecordStream(copies=1, train=train, eval_records=list(eval_records), encode=lambda text: [0] * len(text),
                        shuffle=False, seed=0, num_epochs=None, source="test", data="--prompt-data rows.jsonl",
                        screen=PromptScreen(limit), eval_data="--eval-prompt-data eval.jsonl")


def test_overlong_rows_are_dropped_and_counted():
    source = stream(rows(3, 9, 4, 12), PromptLimit(5), eval_records=rows(2, 6))
    assert [record.location for record in source.train] == ["rows.jsonl:1", "rows.jsonl:3"]
    assert [record.location for record in source.eval] == ["rows.jsonl:1"]
    report = source.prompt_report
    assert (report.rows, report.dropped_overlong, report.first_dropped) == (6, 3, "rows.jsonl:2, 9 tokens")


def test_with_error_the_first_overlong_row_is_named_with_both_lengths():
    with pytest.raises(UsageError) as raised:
        stream(rows(3, 9), PromptLimit(5, overlong="error"))
    assert str(raised.value) == ("rows.jsonl:2: the prompt has 9 tokens, more than --max-prompt-length 5; shorten or "
                                 "remove the row, or skip such rows with --overlong-prompts drop")


def test_a_split_left_empty_is_an_error_naming_it():
    with pytest.raises(UsageError, match=r"^--prompt-data rows.jsonl: every one of its 2 prompt\(s\) is longer than "
                                         r"--max-prompt-length 5 \(the first: rows.jsonl:1, 7 tokens\)"):
        stream(rows(7, 8), PromptLimit(5))
    with pytest.raises(UsageError, match="^--eval-prompt-data eval.jsonl: every one of its 1 prompt"):
        stream(rows(1), PromptLimit(5), eval_records=rows(8))


def test_every_row_is_encoded_at_construction_and_a_refusal_names_the_row():
    def encode(text: str) -> list[int]:
        if "é" in text:
            raise UsageError("the tokenizer cannot encode the character 'é' (U+00E9) of the prompt")
        return [0] * len(text)

    records = [Record("ab", None, location="rows.jsonl:1"), Record("cé", None, location="rows.jsonl:2")]
    with pytest.raises(UsageError) as raised:
        RecordStream(copies=1, train=records, eval_records=[], encode=encode, shuffle=False, seed=0, num_epochs=None,
                     source="test", data="--prompt-data rows.jsonl")
    assert str(raised.value) == "rows.jsonl:2: the tokenizer cannot encode the character 'é' (U+00E9) of the prompt"


# ------------------------------------------------------------------------------- start-up's report
class Reporting:
    def __init__(self, report):
        self.prompt_report = report


def test_start_up_prints_the_drops_and_returns_the_metric_once(tmp_path):
    source = stream(rows(3, 9, 4), PromptLimit(5))
    out = io.StringIO()
    metrics = report_prompts(make_config(), source, out)
    assert metrics == {"data/dropped_overlong": 1.0}
    assert out.getvalue() == ("plasmid: dropped 1 of 3 prompts of --prompt-data rows.jsonl: longer than "
                              "--max-prompt-length 5 (the first: rows.jsonl:2, 9 tokens); --overlong-prompts error "
                              "refuses them instead\n")
    quiet = io.StringIO()
    assert report_prompts(make_config(), stream(rows(3), PromptLimit(5)), quiet) == {"data/dropped_overlong": 0.0}
    assert quiet.getvalue() == ""
    assert report_prompts(make_config(), object(), quiet) == {}
    unlimited = stream(rows(3), PromptLimit(None))
    assert report_prompts(make_config(), unlimited, quiet) == {}, "no limit was applied: no metric"


def test_plain_prompts_for_a_given_model_with_a_chat_template_are_warned_about(tmp_path):
    from plasmid.types import PromptReport

    report = PromptReport(data="--prompt-data rows.jsonl", rows=3, chat_template_flag="--apply-chat-template")
    out = io.StringIO()
    report_prompts(make_config(model=str(tmp_path)), Reporting(report), out)
    assert out.getvalue() == (
        f"plasmid: warning: the tokenizer of --model {tmp_path} has a chat template (an instruct model?), but the "
        f"prompts of --prompt-data rows.jsonl are encoded as plain text; add --apply-chat-template to encode each as "
        f"a user message with the template's generation prompt (plain text is kept if you leave it out)\n")
    recipe = io.StringIO()  # a recipe's model (not given by the user) is no instruct model
    report_prompts(make_config(), Reporting(report), recipe)
    assert recipe.getvalue() == ""


# ------------------------------------------------------------------------------- engines' refusal
def test_the_refusal_of_a_request_past_the_context_is_worded_as_vllm_words_it():
    error = ContextLengthError(64, 20, 60, where="engine 'torchgen'")
    assert isinstance(error, ValueError)
    assert str(error) == ("engine 'torchgen': This model's maximum context length is 64 tokens. However, you "
                          "requested 80 tokens (20 in the messages, 60 in the completion). Please reduce the length "
                          "of the messages or completion.")
    assert (error.context, error.prompt_tokens, error.completion_tokens) == (64, 20, 60)
    copy = pickle.loads(pickle.dumps(error))  # a Ray actor's error reaches the driver pickled
    assert str(copy) == str(error) and (copy.context, copy.prompt_tokens, copy.completion_tokens) == (64, 20, 60)


@pytest.mark.parametrize("answer", [
    # vLLM (0.6-0.8)
    '{"object":"error","message":"This model\'s maximum context length is 1024 tokens. However, you requested 1100 '
    'tokens (100 in the messages, 1000 in the completion). Please reduce the length of the messages or '
    'completion.","type":"BadRequestError","param":null,"code":400}',
    # vLLM (0.9 on)
    '{"error":{"message":"\'max_tokens\' or \'max_completion_tokens\' is too large: 1000. This model\'s maximum '
    'context length is 1024 tokens and your request has 100 input tokens (1000 > 1024 - 100). None",'
    '"type":"BadRequestError","param":null,"code":400}}',
    # SGLang
    '{"error":{"message":"Requested token count exceeds the model\'s maximum context length of 1024 tokens. You '
    'requested a total of 1100 tokens: 100 tokens from the input messages and 1000 tokens for the completion."}}',
    '{"error":{"message":"The input (1100 tokens) is longer than the model\'s context length (1024 tokens)."}}',
])
def test_a_servers_refusal_for_length_becomes_the_error_naming_both_lengths(answer):
    error = ContextLengthError.from_server(answer, 100, 1000, where="sglang generate")
    assert error is not None and error.context == 1024
    assert str(error).startswith("sglang generate: This model's maximum context length is 1024 tokens. However, you "
                                 "requested 1100 tokens (100 in the messages, 1000 in the completion)")


def test_other_refusals_are_not_taken_for_length():
    assert ContextLengthError.from_server('{"error": "token id 99 out of vocabulary"}', 3, 4) is None
    assert ContextLengthError.from_server("prompt longer than the context length", 3, 4) is None  # no number
    assert ContextLengthError.from_server("prompt longer than the context length", 3, 4, context=5).context == 5
