"""What torchgen promises beyond the engine contract: batching, per-row determinism, weight
handling of tied embeddings, abort and shutdown semantics, other architectures."""

import asyncio
import math

import numpy as np
import plasmid_torchgen.plugin
import pytest
import torch

from plasmid.errors import ProviderError, UsageError
from plasmid.testing import build, make_config, make_registry, run
from plasmid.types import SamplingParams, Status
from plasmid_torch.tiny import BOS_ID, build_tiny_model

torch.set_num_threads(1)

PROMPTS = [[BOS_ID, 4, 5, 14, 6, 15], [BOS_ID, 7], [BOS_ID, 3, 3, 3, 3, 3, 3, 3, 3, 3, 9], [BOS_ID, 12, 8, 15]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("torchgen") / "qwen2", seed=0, max_positions=4096)


@pytest.fixture
def engine(make_engine, model_dir):
    return make_engine(model_dir)


def generate_all(engine, requests):
    """Answers to ``(prompt, params)`` requests submitted concurrently."""

    async def scenario():
        return await asyncio.gather(*(engine.generate(prompt, params) for prompt, params in requests))

    return run(scenario())


def generate_each_alone(engine, requests):
    return [run(engine.generate(prompt, params)) for prompt, params in requests]


async def decode_steps(engine, count):
    """Return once the engine has run ``count`` more decoding steps (whatever the machine's speed)."""
    target = engine.stats()["decode_steps"] + count
    while engine.stats()["decode_steps"] < target:
        await asyncio.sleep(0.002)


# ---------------------------------------------------------------------------------------------
# Registration and configuration
# ---------------------------------------------------------------------------------------------


def test_torchgen_is_the_default_engine():
    provider = make_registry(plasmid_torchgen.plugin).choose("engine", None)
    assert provider.name == "torchgen" and provider.default


def test_engine_without_a_model_is_a_usage_error_naming_the_flag():
    with pytest.raises(UsageError, match="--model"):
        build("engine", "torchgen", plasmid_torchgen.plugin, config=make_config(plasmid_torchgen.plugin))


# ---------------------------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------------------------


def test_concurrent_calls_are_decoded_as_one_batch(engine):
    outputs = generate_all(engine, [(PROMPTS[i % 4], SamplingParams(max_new_tokens=5)) for i in range(64)])
    stats = engine.stats()
    assert stats["batches"] == 1
    # the prefill runs the 4 distinct prompts (see the prompt-sharing test), each decoding step 64 rows
    assert stats["max_batch_size"] == 64 and stats["forward_rows"] == 4 + 4 * 64
    assert stats["decode_steps"] == 4, "the first token comes from the prefill, then one step per token"
    assert stats["generated_tokens"] == sum(len(o.token_ids) for o in outputs) == 64 * 5
    assert stats["requests"] == 64


def test_rows_of_a_batch_decode_as_they_would_alone(engine):
    """Left padding, rows leaving at different steps (stop tokens, lengths) change no row's tokens."""
    requests = [(PROMPTS[i % 4], SamplingParams(temperature=0.0, max_new_tokens=3 + 2 * i, stop_token_ids=(i + 3,)))
                for i in range(8)]
    alone = generate_each_alone(engine, requests)
    together = generate_all(engine, requests)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [o.status for o in together] == [o.status for o in alone]
    np.testing.assert_allclose([lp for o in together for lp in o.logprobs],
                               [lp for o in alone for lp in o.logprobs], rtol=0, atol=1e-5)


def test_requests_with_one_prompt_share_its_prefill_and_answer_as_alone(engine):
    """A GRPO group: requests with the same prompt are prefilled as one row, then sample apart."""
    requests = [(PROMPTS[i % 2], SamplingParams(temperature=0.9, max_new_tokens=2 + i, seed=100 + i,
                                                stop_token_ids=(i + 3,))) for i in range(12)]
    alone = generate_each_alone(engine, requests)
    before = engine.stats()
    together = generate_all(engine, requests)
    after = engine.stats()
    assert [(o.token_ids, o.status) for o in together] == [(o.token_ids, o.status) for o in alone]
    np.testing.assert_allclose([lp for o in together for lp in o.logprobs],
                               [lp for o in alone for lp in o.logprobs], rtol=0, atol=1e-5)
    assert len({tuple(o.token_ids) for o in together[0::2]}) > 1, "the samples of one prompt differ"
    prefill_rows = after["forward_rows"] - before["forward_rows"] - sum(len(o.token_ids) - 1 for o in together)
    assert after["batches"] - before["batches"] == 1 and prefill_rows == 2
    assert after["prompt_tokens"] - before["prompt_tokens"] == len(PROMPTS[0]) + len(PROMPTS[1])
    assert after["shared_prompt_tokens"] - before["shared_prompt_tokens"] == 5 * (len(PROMPTS[0]) + len(PROMPTS[1]))


def test_generate_many_answers_as_concurrent_generate_calls_in_one_batch(engine):
    requests = [(PROMPTS[i % 4], SamplingParams(temperature=0.8, max_new_tokens=2 + i, seed=10 + i,
                                                stop_token_ids=(i + 3,))) for i in range(8)]
    separately = generate_all(engine, requests)
    before = engine.stats()
    together = run(engine.generate_many([p for p, _ in requests], [params for _, params in requests]))
    after = engine.stats()
    assert [(o.token_ids, o.status) for o in together] == [(o.token_ids, o.status) for o in separately]
    np.testing.assert_allclose([lp for o in together for lp in o.logprobs],
                               [lp for o in separately for lp in o.logprobs], rtol=0, atol=1e-5)
    assert after["batches"] - before["batches"] == 1 and after["requests"] - before["requests"] == 8


def test_generate_many_with_one_bad_prompt_queues_nothing(engine):
    with pytest.raises(ValueError, match="token id 99"):
        run(engine.generate_many([PROMPTS[0], [BOS_ID, 99]], [GREEDY, GREEDY]))
    assert engine.stats()["requests"] == 0 and not engine._waiting


def test_a_cancelled_generate_many_leaves_the_batch(engine):
    long = SamplingParams(max_new_tokens=3000)

    async def scenario():
        many = asyncio.ensure_future(engine.generate_many([PROMPTS[0], PROMPTS[1]], [long, long]))
        await decode_steps(engine, 5)
        many.cancel()
        await asyncio.gather(many, return_exceptions=True)
        # a one-token request is answered by a step that starts after the cancellation is known
        await engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=1))
        return engine._batch

    assert run(scenario()) is None, "the cancelled rows left the running batch"


def test_request_arriving_mid_generation_joins_the_running_batch(engine):
    long_params = SamplingParams(temperature=0.0, max_new_tokens=300)
    short_alone = run(engine.generate(PROMPTS[2], GREEDY))
    long_alone = run(engine.generate(PROMPTS[1], long_params))
    before = engine.stats()

    async def scenario():
        long_request = asyncio.ensure_future(engine.generate(PROMPTS[1], long_params))
        await decode_steps(engine, 20)
        short = await engine.generate(PROMPTS[2], GREEDY)
        assert not long_request.done(), "the short request waited for the long one to finish"
        return short, await long_request

    short, long = run(scenario())
    stats = engine.stats()
    assert short.token_ids == short_alone.token_ids
    assert long.token_ids == long_alone.token_ids
    np.testing.assert_allclose(short.logprobs, short_alone.logprobs, rtol=0, atol=1e-5)
    np.testing.assert_allclose(long.logprobs, long_alone.logprobs, rtol=0, atol=1e-5)
    assert stats["batches"] - before["batches"] == 2
    assert stats["max_batch_size"] == 2


def test_max_batch_size_keeps_later_requests_waiting(make_engine, model_dir):
    engine = make_engine(model_dir, torchgen_max_batch_size=3)
    outputs = generate_all(engine, [(PROMPTS[0], SamplingParams(max_new_tokens=4)) for _ in range(7)])
    assert all(len(o.token_ids) == 4 for o in outputs)
    assert engine.stats()["max_batch_size"] == 3


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------


def test_seeded_request_gives_the_same_tokens_alone_and_inside_a_batch(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1234)
    alone = run(engine.generate(PROMPTS[0], params))
    others = [(PROMPTS[i % 4], SamplingParams(temperature=[1.0, 0.0, 0.6][i % 3], max_new_tokens=16,
                                             seed=None if i % 2 else i)) for i in range(20)]
    outputs = generate_all(engine, others[:7] + [(PROMPTS[0], params)] + others[7:])
    assert outputs[7].token_ids == alone.token_ids
    np.testing.assert_allclose(outputs[7].logprobs, alone.logprobs, rtol=0, atol=1e-5)


def test_requests_without_seed_follow_the_configured_seed(make_engine, model_dir):
    requests = [(PROMPTS[i % 4], SamplingParams(max_new_tokens=8)) for i in range(6)]
    first = generate_all(make_engine(model_dir, seed=5), requests)
    second = generate_all(make_engine(model_dir, seed=5), requests)
    other = generate_all(make_engine(model_dir, seed=6), requests)
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    assert [o.token_ids for o in first] != [o.token_ids for o in other]


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    greedy = run(engine.generate(PROMPTS[3], GREEDY))
    top_k = run(engine.generate(PROMPTS[3], SamplingParams(temperature=1.0, top_k=1, max_new_tokens=12, seed=9)))
    top_p = run(engine.generate(PROMPTS[3], SamplingParams(temperature=1.5, top_p=1e-6, max_new_tokens=12)))
    assert top_k.token_ids == greedy.token_ids == top_p.token_ids
    np.testing.assert_allclose(top_k.logprobs, greedy.logprobs, rtol=0, atol=1e-6)


def test_multiple_stop_tokens_end_at_the_first_one_met(engine):
    free_run = run(engine.generate(PROMPTS[0], GREEDY)).token_ids
    stops = (free_run[5], free_run[2])
    first = min(free_run.index(t) for t in stops)
    output = run(engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=stops)))
    assert output.token_ids == free_run[:first + 1]
    assert output.status is Status.COMPLETED


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def test_zeroed_tied_embeddings_make_every_logprob_minus_log_vocab(engine):
    vocab = engine.vocab_size
    zeros = np.zeros((vocab, engine.model.config.hidden_size), np.float32)
    run(engine.update_weights([("model.embed_tokens.weight", zeros)], weight_version=1))
    outputs = generate_all(engine, [(p, SamplingParams(temperature=0.7, max_new_tokens=6)) for p in PROMPTS])
    uniform = -float(torch.tensor(float(vocab)).log())
    assert {lp for o in outputs for lp in o.logprobs} == {uniform}
    assert math.isclose(uniform, -math.log(vocab), rel_tol=1e-6)
    served = run(engine.get_weights(["lm_head.weight"]))
    np.testing.assert_array_equal(served["lm_head.weight"], zeros)


def test_lm_head_name_updates_the_tied_embedding_table(engine):
    table = run(engine.get_weights(["model.embed_tokens.weight"]))["model.embed_tokens.weight"]
    run(engine.update_weights([("lm_head.weight", torch.from_numpy(table * 2))], weight_version=2))
    served = run(engine.get_weights(["model.embed_tokens.weight", "lm_head.weight"]))
    np.testing.assert_array_equal(served["model.embed_tokens.weight"], table * 2)
    np.testing.assert_array_equal(served["lm_head.weight"], table * 2)


def test_bucket_with_an_unknown_name_changes_nothing(engine):
    norm = run(engine.get_weights(["model.norm.weight"]))["model.norm.weight"]
    bucket = [("model.norm.weight", norm + 1), ("model.nrom.weight", norm)]
    with pytest.raises(ValueError, match=r"'model\.nrom\.weight'.*did you mean 'model\.norm\.weight'"):
        run(engine.update_weights(bucket, weight_version=4))
    assert engine.weight_version == 0
    np.testing.assert_array_equal(run(engine.get_weights(["model.norm.weight"]))["model.norm.weight"], norm)


def test_shape_mismatch_is_an_error_naming_both_shapes(engine):
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' has shape \(3,\).*\(64,\)"):
        run(engine.update_weights([("model.norm.weight", np.zeros(3, np.float32))], weight_version=1))


def test_get_weights_of_an_unknown_name_is_an_error(engine):
    with pytest.raises(ValueError, match="no tensor named 'model.layers.9.mlp.up_proj.weight'"):
        run(engine.get_weights(["model.layers.9.mlp.up_proj.weight"]))


# ---------------------------------------------------------------------------------------------
# Abort, cancellation, failures, shutdown
# ---------------------------------------------------------------------------------------------


def test_abort_all_answers_waiting_requests_too(make_engine, model_dir):
    engine = make_engine(model_dir, torchgen_max_batch_size=1)
    params = SamplingParams(max_new_tokens=3000)

    async def scenario():
        running = asyncio.ensure_future(engine.generate(PROMPTS[0], params))
        waiting = asyncio.ensure_future(engine.generate(PROMPTS[1], params))
        await decode_steps(engine, 5)
        return await engine.abort_all(), await running, await waiting

    aborted, running, waiting = run(scenario())
    assert aborted == 2
    assert running.status is waiting.status is Status.ABORTED
    assert 0 < len(running.token_ids) < 3000
    assert waiting.token_ids == [] and waiting.logprobs == []
    assert engine.stats()["aborted"] == 2


def test_cancelled_caller_leaves_the_batch(engine):
    params = SamplingParams(max_new_tokens=3000)

    async def rows_per_forward_pass(during):
        before = engine.stats()
        await during
        after = engine.stats()
        forwards = (after["decode_steps"] + after["batches"]) - (before["decode_steps"] + before["batches"])
        return (after["forward_rows"] - before["forward_rows"]) / forwards

    async def scenario():
        kept = asyncio.ensure_future(engine.generate(PROMPTS[0], params))
        cancelled = asyncio.ensure_future(engine.generate(PROMPTS[1], params))
        two_rows = await rows_per_forward_pass(decode_steps(engine, 20))
        cancelled.cancel()
        # A one-token request is answered by a step that starts after the cancellation is known.
        await engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=1))
        one_row = await rows_per_forward_pass(decode_steps(engine, 20))
        await engine.abort_all()
        await kept
        return two_rows, one_row

    two_rows, one_row = run(scenario())
    assert two_rows == 2 and one_row == 1


def test_failing_forward_pass_fails_its_requests_and_the_engine_recovers(engine, monkeypatch):
    decoder = engine._decoder
    real_prefill = decoder.prefill

    def broken_prefill(requests):
        monkeypatch.setattr(decoder, "prefill", real_prefill)
        raise RuntimeError("simulated out of memory")

    monkeypatch.setattr(decoder, "prefill", broken_prefill)
    with pytest.raises(ProviderError, match="simulated out of memory"):
        run(engine.generate(PROMPTS[0], GREEDY))
    assert len(run(engine.generate(PROMPTS[0], GREEDY)).token_ids) == 12


def test_shutdown_aborts_in_flight_requests_and_refuses_new_ones(make_engine, model_dir):
    engine = make_engine(model_dir)

    async def scenario():
        in_flight = asyncio.ensure_future(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=3000)))
        await asyncio.sleep(0.1)
        await engine.shutdown()
        return await in_flight

    assert run(scenario()).status is Status.ABORTED
    with pytest.raises(RuntimeError, match="shut down"):
        run(engine.generate(PROMPTS[0], GREEDY))


@pytest.mark.parametrize("prompt, message", [([], "empty"), ([BOS_ID, 99], "token id 99")])
def test_invalid_prompts_are_rejected_before_decoding(engine, prompt, message):
    with pytest.raises(ValueError, match=message):
        run(engine.generate(prompt, GREEDY))


# ---------------------------------------------------------------------------------------------
# Other architectures
# ---------------------------------------------------------------------------------------------


def test_llama_architecture_batches_and_scores_consistently(make_engine, tmp_path):
    engine = make_engine(build_tiny_model(tmp_path / "llama", arch="llama", seed=3, tie_word_embeddings=False))
    requests = [(PROMPTS[i % 4], SamplingParams(temperature=0.9, max_new_tokens=6 + i, seed=i)) for i in range(6)]
    together = generate_all(engine, requests)
    alone = generate_each_alone(engine, requests)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    for (prompt, params), output in zip(requests, together, strict=True):
        scored = run(engine.score(prompt + output.token_ids, len(prompt), params.temperature))
        np.testing.assert_allclose(scored, output.logprobs, rtol=0, atol=1e-5)
    lm_head = run(engine.get_weights(["lm_head.weight"]))["lm_head.weight"]
    run(engine.update_weights([("lm_head.weight", np.zeros_like(lm_head))], weight_version=1))
    output = run(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4)))
    assert set(output.logprobs) == {-float(torch.tensor(float(engine.vocab_size)).log())}


# ---------------------------------------------------------------------------------------------
# The context limit
# ---------------------------------------------------------------------------------------------


def test_a_request_past_the_models_context_is_refused_naming_both_lengths(make_engine, tmp_path):
    from plasmid.errors import ContextLengthError

    short = build_tiny_model(tmp_path / "short", seed=0, max_positions=16, hidden_size=16, num_layers=1, num_heads=2)
    engine = make_engine(short)
    assert engine.context == 16
    with pytest.raises(ContextLengthError) as raised:
        run(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=11)))
    assert str(raised.value) == (
        f"engine 'torchgen' (plugin plasmid-torchgen), model {short}: This model's maximum context length is 16 "
        f"tokens. However, you requested 17 tokens (6 in the messages, 11 in the completion). Please reduce the "
        f"length of the messages or completion.")
    with pytest.raises(ContextLengthError, match="requested 17 tokens"):
        run(engine.generate_many([PROMPTS[1], PROMPTS[0]], [GREEDY, SamplingParams(max_new_tokens=11)]))
    assert engine.stats()["requests"] == 0 and not engine._waiting, "nothing was served or queued"
    with pytest.raises(ContextLengthError, match="requested 17 tokens \\(17 in the messages, 0 in the completion\\)"):
        run(engine.score([BOS_ID] + [4] * 16, 1, 1.0))
    fits = run(engine.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_new_tokens=10)))
    assert len(fits.token_ids) <= 10 and fits.status in (Status.COMPLETED, Status.TRUNCATED)
