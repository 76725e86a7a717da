"""Aborting a step while a multi-turn sample's tool runs: with ``--partial-rollout`` the sample goes
back to the data source as a partial conversation (not reset to its prompt), at once rather than
after the abort grace, and the next step resumes it at the call."""

from __future__ import annotations

import asyncio
import time

import plasmid_multiturn.plugin
import plasmid_rollout.driver
import plasmid_rollout.plugin
import pytest

from plasmid.context import RolloutContext
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.session import instantiate
from plasmid.testing import make_config, make_registry
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Group, Sample, SamplingParams, Status

EOS = 2


class Chars:
    """One id per character (``3 + ord``), ``<eos>`` 2."""

    eos_token_id = EOS

    def encode(self, text, add_special_tokens=True):
        return [3 + ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 3) for i in ids if i != EOS)


TOKENIZER = Chars()
CALL = TOKENIZER.encode('<tool_call>{"name": "probe", "arguments": {}}</tool_call>')
ANSWER = TOKENIZER.encode("<tool_response>ok</tool_response>")
DONE = TOKENIZER.encode("done") + [EOS]


class Probe:
    """Answers ``ok``; for the prompt labelled ``slow`` it hangs while :attr:`hang` is true."""

    name, description, parameters = "probe", "test tool", {"type": "object", "properties": {}}
    hang, calls = True, []

    async def __call__(self, arguments, sample):
        Probe.calls.append(sample.label)
        while sample.label == "slow" and Probe.hang:
            await asyncio.sleep(0.01)
        return "ok"


class Source:
    """Two one-sample groups, ``fast`` then ``slow``; groups given back come out first."""

    def __init__(self):
        self.queue = [Group([Sample(prompt=label, tokens=TOKENIZER.encode(label), label=label, index=i,
                                    group_index=i)], i) for i, label in enumerate(["fast", "slow"])]
        self.returned: list[Group] = []

    def get_groups(self, n):
        taken, self.queue = self.queue[:n], self.queue[n:]
        return taken

    def add_groups(self, groups):
        self.returned = list(groups)
        self.queue = [*groups, *self.queue]


class Done:
    async def __call__(self, sample):
        return float(sample.response.endswith("done"))


def reply(prompt_ids, params):
    """The model calls the tool first, then answers ``done``."""
    return Reply(DONE) if prompt_ids[-len(ANSWER):] == ANSWER else Reply(CALL)


@pytest.mark.timeout(120)
def test_an_abort_mid_tool_call_returns_the_partial_conversation_at_once_and_it_resumes(monkeypatch, tmp_path):
    monkeypatch.setattr(plasmid_rollout.driver, "ABORT_GRACE_SECONDS", 30.0)  # a slow path would show
    plugins = (plasmid_multiturn.plugin, plasmid_rollout.plugin)
    config = make_config(*plugins, run_dir=tmp_path, generate="multiturn", prompts_per_step=1,
                         n_samples_per_prompt=1, over_sampling=2.0, partial_rollout=True, tool_timeout=60)
    registry = make_registry(*plugins)
    source = Source()
    ctx = RolloutContext(config=config, engines=[ScriptedEngine(reply)], data_source=source, tokenizer=TOKENIZER,
                         generate=instantiate(registry.get("generate", "multiturn"), config),
                         rewards=RewardSet([RewardComponent("done", 1.0, Done())]), tools={"probe": Probe()},
                         sampling=SamplingParams(max_new_tokens=100, stop_token_ids=(EOS,)))
    driver = instantiate(registry.get("rollout", "rollout"), config)

    began = time.perf_counter()
    first = asyncio.run(driver.run(ctx, 0))
    assert time.perf_counter() - began < 15, "the abort waited for the grace period instead of the tool"
    assert [g.samples[0].label for g in first.groups] == ["fast"] and first.groups[0].samples[0].reward == 1.0
    assert first.metrics["rollout/groups_aborted"] == 1.0
    [returned] = source.returned
    partial = returned.samples[0]
    assert partial.status == Status.ABORTED, "the aborted sample was reset to its prompt"
    assert partial.tokens == TOKENIZER.encode("slow") + CALL and partial.loss_mask == [1] * len(CALL)
    assert len(partial.rollout_logprobs) == len(CALL)
    assert partial.metadata["multiturn"]["turns"] == 1 and partial.metadata["multiturn"]["tool_calls"] == 0
    assert not ctx.aborting.is_set(), "the step's abort stays in the step"

    Probe.hang = False
    second = asyncio.run(driver.run(ctx, 1))
    resumed = second.groups[0].samples[0]
    assert resumed.label == "slow" and resumed.status == Status.COMPLETED and resumed.reward == 1.0
    assert resumed.tokens == TOKENIZER.encode("slow") + CALL + ANSWER + DONE
    assert resumed.loss_mask == [1] * len(CALL) + [0] * len(ANSWER) + [1] * len(DONE)
    assert resumed.metadata["multiturn"]["tool_calls"] == 1 and Probe.calls == ["fast", "slow", "slow"]
