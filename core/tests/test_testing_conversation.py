"""``plasmid.testing.conversation``: the recording engine, and the token-in-token-out check passing a
correct conversation and naming each kind of wrong one (re-encoded tokens, a turn not cut where
it says, a misplaced log-prob or mask, a prompt that is not the sample so far)."""

from __future__ import annotations

import copy

import pytest

from plasmid.testing import run
from plasmid.testing.conversation import RecordingEngine, check_token_in_token_out
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams

PROMPT, TOOL = [1, 4, 5], [9, 9]
PARAMS = SamplingParams(max_new_tokens=8)


def conversation():
    """Two engine turns with a tool answer between them, the first cut after 2 of its 3 ids, as a
    generate function should lay them out."""
    engine = RecordingEngine(ScriptedEngine([Reply([6, 7, 8], [-0.1, -0.2, -0.3]), Reply([10, 2], [-0.4, -0.5])]))

    async def talk():
        first = await engine.generate(PROMPT, PARAMS)
        second = await engine.generate(PROMPT + first.token_ids[:2] + TOOL, PARAMS)
        return first, second

    first, second = run(talk())
    response = first.token_ids[:2] + TOOL + second.token_ids
    sample = Sample(prompt="p", tokens=PROMPT + response, response_length=len(response),
                    loss_mask=[1, 1, 0, 0, 1, 1], rollout_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.4, -0.5])
    return engine, sample


def test_the_recording_engine_records_each_call_and_passes_the_rest_through():
    engine, _ = conversation()
    assert [c.prompt_ids for c in engine.calls] == [PROMPT, PROMPT + [6, 7] + TOOL]
    assert engine.calls[1].output.token_ids == [10, 2] and engine.weight_version == 0
    assert run(engine.abort_all()) == 0 and engine.engine.aborts == 1


def test_a_correct_conversation_passes():
    engine, sample = conversation()
    check_token_in_token_out(sample, engine.calls, environment=[TOOL], kept=[2, None])


def change(sample, **fields):
    changed = copy.deepcopy(sample)
    for name, value in fields.items():
        setattr(changed, name, value)
    return changed


@pytest.mark.parametrize(("fault", "message"), [
    ({"tokens": PROMPT + [6, 7, 9, 3, 10, 2]}, "are not the engine's and the environment's ids"),  # re-encoded
    ({"loss_mask": [1, 1, 1, 0, 1, 1]}, "loss_mask"),
    ({"rollout_logprobs": [-0.2, -0.1, 0.0, 0.0, -0.4, -0.5]}, "rollout_logprobs"),
    ({"rollout_logprobs": None}, "rollout_logprobs"),
    ({"response_length": 5}, "response_length"),
])
def test_a_wrong_sample_is_named(fault, message):
    engine, sample = conversation()
    with pytest.raises(AssertionError, match=message):
        check_token_in_token_out(change(sample, **fault), engine.calls, environment=[TOOL], kept=[2, None])


def test_a_wrong_layout_claim_or_a_prompt_that_is_not_the_sample_so_far_is_named():
    engine, sample = conversation()
    with pytest.raises(AssertionError, match="engine request 1's prompt is not the sample's tokens so far"):
        check_token_in_token_out(sample, engine.calls, environment=[TOOL])  # the first turn was not kept whole
    with pytest.raises(AssertionError, match="need 1 environment segments"):
        check_token_in_token_out(sample, engine.calls, environment=[], kept=[2, None])
    with pytest.raises(AssertionError, match="kept\\[0\\] = 4, but engine request 0 returned 3 ids"):
        check_token_in_token_out(sample, engine.calls, environment=[TOOL], kept=[4, None])
    with pytest.raises(AssertionError, match="no engine request"):
        check_token_in_token_out(sample, [], environment=[])
