"""What plasmid sends to SGLang's /generate and how it reads the answers (no server needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from plasmid_sglang.requests import (
    generate_request,
    logprobs_at_temperature,
    needs_continuation,
    parse_generate,
    parse_score,
    parse_version,
    score_request,
)

from plasmid.types import SamplingParams, Status


def answer(output_ids, finish, version="default", logprobs=None):
    logprobs = logprobs if logprobs is not None else [-1.0 - i for i in range(len(output_ids))]
    return {"output_ids": output_ids, "meta_info": {
        "finish_reason": finish, "weight_version": version,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, output_ids, strict=True)]}}


def test_sampling_parameters_map_to_sglang_names_and_conventions():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=12, stop_token_ids=(2, 5), seed=9)
    body = generate_request([1, 4, 5], params, max_new_tokens=7)
    assert body["input_ids"] == [1, 4, 5] and body["return_logprob"] is True
    assert body["sampling_params"] == {"max_new_tokens": 7, "temperature": 0.7, "top_p": 0.9, "top_k": -1,
                                       "stop_token_ids": [2, 5], "sampling_seed": 9}


def test_a_request_without_stop_tokens_ignores_the_models_end_of_sequence():
    body = generate_request([1], SamplingParams(top_k=5, max_new_tokens=3), max_new_tokens=3)
    assert body["sampling_params"]["ignore_eos"] is True
    assert body["sampling_params"]["top_k"] == 5
    assert "stop_token_ids" not in body["sampling_params"] and "sampling_seed" not in body["sampling_params"]


@pytest.mark.parametrize(("finish", "status"), [({"type": "length", "length": 3}, Status.TRUNCATED),
                                                ({"type": "stop", "matched": 2}, Status.COMPLETED),
                                                ({"type": "abort", "message": "aborted"}, Status.ABORTED)])
def test_finish_reasons_become_statuses(finish, status):
    generated = parse_generate(answer([7, 8, 2], finish, version="4"))
    assert generated.status is status
    assert generated.token_ids == [7, 8, 2] and generated.logprobs == [-1.0, -2.0, -3.0]
    assert generated.weight_version == 4


def test_an_unknown_finish_reason_or_missing_logprobs_is_an_error():
    with pytest.raises(ValueError, match="unknown finish reason"):
        parse_generate(answer([1], {"type": "exploded"}))
    broken = answer([1, 2], {"type": "length"})
    broken["meta_info"]["output_token_logprobs"] = broken["meta_info"]["output_token_logprobs"][:1]
    with pytest.raises(ValueError, match="2 tokens with 1 log-probs"):
        parse_generate(broken)


def test_weight_versions_read_as_integers_and_default_as_zero():
    assert parse_version("12") == 12 and parse_version("default") == 0 and parse_version(None) == 0


def test_a_stop_on_an_end_of_sequence_token_not_asked_for_is_continued():
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(5,))
    assert needs_continuation(parse_generate(answer([3, 2], {"type": "stop", "matched": 2})), params)
    assert not needs_continuation(parse_generate(answer([3, 5], {"type": "stop", "matched": 5})), params)
    assert not needs_continuation(parse_generate(answer([3, 2], {"type": "length"})), params)


def test_score_asks_from_one_position_early_and_for_every_token_away_from_temperature_one():
    at_one = score_request([1, 4, 5, 6, 7], prompt_length=3, temperature=1.0, vocab_size=16)
    assert at_one["logprob_start_len"] == 2 and at_one["sampling_params"]["max_new_tokens"] == 0
    assert "top_logprobs_num" not in at_one
    assert "top_logprobs_num" not in score_request([1, 4], 1, 0.0, 16), "greedy scores at temperature 1"
    assert score_request([1, 4, 5], 1, 0.7, vocab_size=16)["top_logprobs_num"] == 16


def test_rescaling_full_vocabulary_logprobs_gives_the_softmax_at_that_temperature():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=16) * 3
    at_one = logits - np.log(np.exp(logits).sum())
    for temperature in (0.3, 0.7, 1.6):
        scaled = logits / temperature
        expected = scaled - np.log(np.exp(scaled).sum())
        for token in (0, 7, 15):
            got = logprobs_at_temperature(dict(enumerate(at_one.tolist())), token, temperature)
            assert got == pytest.approx(expected[token], abs=1e-12)


def test_score_answers_drop_the_empty_first_position():
    meta = {"input_token_logprobs": [[None, 0, None], [-0.5, 6, None], [-1.5, 7, None]]}
    assert parse_score({"meta_info": meta}, [1, 4, 6, 7], prompt_length=2, temperature=1.0) == [-0.5, -1.5]
    uniform = [[math.log(1 / 4), t, None] for t in range(4)]
    meta = {"input_top_logprobs": [None, uniform, uniform]}
    assert parse_score({"meta_info": meta}, [1, 4, 2, 3], prompt_length=2, temperature=0.5) == \
        pytest.approx([math.log(1 / 4)] * 2)
    with pytest.raises(ValueError, match="1 input log-probs for 2 scored tokens"):
        parse_score({"meta_info": {"input_token_logprobs": [[None, 0, None], [-0.5, 6, None]]}}, [1, 4, 6, 7], 2, 1.0)


def test_stop_strings_go_to_sglang_untrimmed_and_a_stop_on_one_is_not_continued():
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(5,), stop=("\nObservation:", "END"))
    sampling = generate_request([1, 4], params, max_new_tokens=8)["sampling_params"]
    assert sampling["stop"] == ["\nObservation:", "END"] and sampling["no_stop_trim"] is True
    assert sampling["stop_token_ids"] == [5]
    plain = generate_request([1, 4], SamplingParams(max_new_tokens=8), max_new_tokens=8)["sampling_params"]
    assert "stop" not in plain and "no_stop_trim" not in plain, "no stop strings: the body is as before"
    # SGLang reports the string it matched; the tokens through the one that completed it are kept
    generated = parse_generate(answer([3, 9, 4], {"type": "stop", "matched": "END"}))
    assert (generated.status, generated.matched_text, generated.token_ids) == (Status.COMPLETED, "END", [3, 9, 4])
    assert not needs_continuation(generated, params), "a stop string asked for ends the response"
