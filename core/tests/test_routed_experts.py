"""The single-turn generate function carries the engine's MoE routing
(``GenerationOutput.routed_experts``) into ``Sample.metadata[ROUTED_EXPERTS_KEY]``, and drops a
resumed sample's old routing when the engine reports none; a resumed sample keeps the weight
version that began it."""

from __future__ import annotations

from dataclasses import replace

from plasmid.builtin import SingleTurn
from plasmid.testing import make_config, run
from plasmid.testing.contracts.generate import STOP, make_context, prompt_sample
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import ROUTED_EXPERTS_KEY, SamplingParams, Status


class RoutingEngine(ScriptedEngine):
    """Reports a made-up routing (one MoE layer, top-2) of every fed token."""

    async def generate(self, prompt_ids, params):
        output = await super().generate(prompt_ids, params)
        fed = (list(prompt_ids) + output.token_ids)[:-1]
        return replace(output, routed_experts=[[[token % 4, (token + 1) % 4]] for token in fed])


def test_single_turn_keeps_the_engines_routing_and_drops_a_stale_one():
    config = make_config()
    generate = SingleTurn(config)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(STOP,))
    engine = RoutingEngine([Reply([70, 71, STOP])])
    sample = run(generate(make_context(config, engine, generate), prompt_sample("ab"), params))
    fed = sample.tokens[:-1]
    assert sample.metadata[ROUTED_EXPERTS_KEY] == [[[t % 4, (t + 1) % 4]] for t in fed]

    sample.status, sample.response_length = Status.ABORTED, 1          # resumed by an engine without routing
    sample.tokens = sample.tokens[:-2]
    plain = ScriptedEngine([Reply([72, STOP])])
    resumed = run(generate(make_context(config, plain, generate), sample, params))
    assert resumed.status == Status.COMPLETED and ROUTED_EXPERTS_KEY not in resumed.metadata


def test_a_resumed_sample_keeps_the_weight_version_that_began_it():
    config = make_config()
    generate = SingleTurn(config)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(STOP,))
    engine = ScriptedEngine([Reply([70, 71]), Reply([72, STOP]), Reply([73, STOP])])
    engine.weight_version = 2
    sample = run(generate(make_context(config, engine, generate), prompt_sample("ab"), params))
    assert sample.weight_version == 2
    sample.status = Status.ABORTED                                   # --partial-rollout kept its 2 tokens
    engine.weight_version = 5
    resumed = run(generate(make_context(config, engine, generate), sample, params))
    assert resumed.response_length == 4 and resumed.weight_version == 2   # staleness counts from version 2
    fresh = run(generate(make_context(config, engine, generate), prompt_sample("ab"), params))
    assert fresh.weight_version == 5
