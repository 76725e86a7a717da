"""Stop strings (``SamplingParams.stop``) in torchgen: a response ends at the token that completed one,
the tokens and log-probs kept are exactly those of the same request without stop strings, up to
that token; requests without stop strings never decode text."""

import asyncio
from dataclasses import replace

import pytest
import torch
from plasmid_torchgen.batch import StopStrings

from plasmid.testing import run
from plasmid.types import SamplingParams, Status
from plasmid_torch.tiny import BOS_ID, build_tiny_model

torch.set_num_threads(1)

PROMPT = [BOS_ID, 4, 5, 14, 6, 15]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("torchgen_stop") / "qwen2", seed=0)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def first_repeat_free_pair(text):
    """``(start, pair)``: the first two characters of ``text`` from index 4 on that occur nowhere before
    ``start`` (so the cut is inside the response, not at its start)."""
    for start in range(4, len(text) - 1):
        pair = text[start:start + 2]
        if text.find(pair) == start:
            return start, pair
    raise AssertionError(f"no usable pair in {text!r}")


def test_a_stop_string_across_a_token_boundary_ends_the_response_on_the_token_that_completed_it(
        make_engine, model_dir, tokenizer):
    engine = make_engine(model_dir)
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=7)  # its own generator: the same draws
    full = run(engine.generate(PROMPT, params))
    text = tokenizer.decode(full.token_ids, skip_special_tokens=True)
    start, pair = first_repeat_free_pair(text)
    # the token that completed the pair: the first whose prefix's text holds it
    kept = next(k for k in range(1, len(full.token_ids) + 1)
                if pair in tokenizer.decode(full.token_ids[:k], skip_special_tokens=True))
    assert kept < len(full.token_ids) - 1 and text[:start + 2].endswith(pair)

    async def together():
        return await asyncio.gather(engine.generate(PROMPT, replace(params, stop=("never", pair))),
                                    engine.generate(PROMPT, params))

    stopped, plain = run(together())
    assert stopped.token_ids == full.token_ids[:kept] and stopped.logprobs == pytest.approx(full.logprobs[:kept])
    assert stopped.status is Status.COMPLETED
    assert tokenizer.decode(stopped.token_ids, skip_special_tokens=True).endswith(pair)
    assert plain.token_ids == full.token_ids and plain.status is Status.TRUNCATED, "its neighbour is untouched"


def test_a_stop_string_that_never_occurs_leaves_the_response_as_it_was(make_engine, model_dir):
    engine = make_engine(model_dir)
    full = run(engine.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=10)))
    stopped = run(engine.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=10, stop=("<none>",))))
    assert (stopped.token_ids, stopped.status) == (full.token_ids, Status.TRUNCATED)


def test_requests_without_stop_strings_never_load_a_tokenizer_or_decode(make_engine, model_dir):
    engine = make_engine(model_dir)
    run(engine.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=6)))
    assert engine._decode is None


def test_an_empty_stop_string_is_refused_before_anything_is_queued(make_engine, model_dir):
    engine = make_engine(model_dir)
    with pytest.raises(ValueError, match="stop strings must be non-empty strings"):
        run(engine.generate(PROMPT, SamplingParams(max_new_tokens=4, stop=("",))))


def test_the_check_reads_only_the_tail_and_finds_a_stop_split_inside_multi_character_tokens():
    pieces = {1: "xx", 2: "ab", 3: "cd", 4: "e"}
    decoded = []

    def decode(ids):
        decoded.append(len(ids))
        return "".join(pieces[i] for i in ids)

    check = StopStrings(("bc",), decode)
    tokens = [1] * 50
    assert not check.completed_by(tokens) and decoded[-1] == check.window == 12, "only the last 12 tokens"
    tokens.append(2)
    assert not check.completed_by(tokens)
    tokens.append(3)
    assert check.completed_by(tokens) and check.matched == "bc", "'b' ends token 2, 'c' starts token 3"
