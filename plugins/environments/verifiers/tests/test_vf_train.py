"""``plasmid train --datasource verifiers --vf-env NAME``: a few steps on the recipe's tiny model,
the environment's rollout driving the engine through the agent gateway, its rubric the reward;
once with the single-turn fixture environment and once with the multi-turn tool environment."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest

from plasmid.app.cli import main
from plasmid.app.rollout_store import RolloutStore
from plasmid.types import GenerationOutput, Status


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.timeout(300)
def test_plasmid_train_with_a_verifiers_environment_trains_on_the_engines_tokens(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--datasource", "verifiers", "--vf-env", "vf_plasmid_sum", "--num-rollouts", "2",
                 "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
                 "--save-interval", "0", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "datasource=verifiers" in err and "generate=agent" in err and "reward=verifiers" in err
    metrics = read_metrics(run_dir)
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert step["train/samples"] == 4.0 and "rollout/reward/verifiers" in step
        assert "rollout/reward/verifiers.exact" in step and "rollout/reward/verifiers.short" in step, \
            "each rubric function is logged as a reward component"
        assert step["rollout/agent/calls_mean"] == 1.0
        assert step["train/logprob_abs_diff_mean"] <= 1e-4, "the gateway's log-probs are the engine's"


#: The end of a first-turn prompt of vf_plasmid_tool as the recipe's chat template renders it.
QUESTION = re.compile(r"(\d+)\+(\d+)=<assistant>$")


class FirstTurnCalls:
    """Stands in for ``TorchEngine.generate`` (monkeypatched): a request whose prompt ends in the
    question ``a+b=`` (the first turn: no tool answer yet) is answered with the call of the ``add``
    tool, its log-probs the engine's own (``TorchEngine.score`` of those tokens at the request's
    temperature, the served weights), so the call is what the untrained tiny model would have to
    sample; every other request is sampled by the engine. ``calls[prompt]`` and
    ``sampled[prompt]`` record ``(ids, logprobs)`` of every answer, by prompt ids."""

    def __init__(self, generate) -> None:
        self.generate = generate
        self.calls: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = defaultdict(list)
        self.sampled: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = defaultdict(list)
        self.tokenizers: dict[str, object] = {}

    def tokenizer(self, engine):
        from plasmid_torch.hf import load_tokenizer

        return self.tokenizers.setdefault(engine.model_path, load_tokenizer(engine.model_path))

    async def __call__(self, engine, prompt_ids, params):
        tokenizer = self.tokenizer(engine)
        question = QUESTION.search(tokenizer.decode(prompt_ids, skip_special_tokens=False))
        if question is None:
            out = await self.generate(engine, prompt_ids, params)
            self.sampled[tuple(prompt_ids)].append((list(out.token_ids), list(out.logprobs)))
            return out
        a, b = question.groups()
        call = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
        ids = tokenizer.encode(call, add_special_tokens=False)
        logprobs = await engine.score(list(prompt_ids) + ids, len(prompt_ids), params.temperature)
        self.calls[tuple(prompt_ids)].append((ids, logprobs))
        return GenerationOutput(ids, logprobs, Status.COMPLETED, engine.weight_version)


@pytest.mark.timeout(300)
def test_plasmid_train_with_a_verifiers_tool_environment_masks_the_tool_turns(tmp_path, capsys, monkeypatch):
    """The tool turns are masked, and the environment's per-step rewards (0.5 for the turn that called
    ``add``) are the saved samples' per-turn rewards, which ``--turn-credit by-turn`` trains on."""
    from plasmid_torchgen.engine import TorchEngine

    engine = FirstTurnCalls(TorchEngine.generate)

    async def generate(self, prompt_ids, params):
        return await engine(self, prompt_ids, params)

    monkeypatch.setattr(TorchEngine, "generate", generate)
    run_dir, saved = tmp_path / "run", tmp_path / "rollouts"
    code = main(["train", "--datasource", "verifiers", "--vf-env", "vf_plasmid_tool", "--num-rollouts", "2",
                 "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--max-new-tokens", "128",
                 "--eval-interval", "0", "--save-interval", "0", "--run-dir", str(run_dir),
                 "--save-rollouts", str(saved), "--vf-env-args", '{"tool_step_reward": 0.5}',
                 "--turn-credit", "by-turn"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "datasource=verifiers" in err and "generate=agent" in err and "reward=verifiers" in err
    assert sum(len(answers) for answers in engine.calls.values()) == 8, "each of the 2 x 4 rollouts called add"

    metrics = read_metrics(run_dir)
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert step["train/samples"] == 4.0
        assert "rollout/reward/verifiers.exact" in step, "the rubric's function is logged as a reward component"
        assert step["rollout/reward/verifiers.add_calls"] == 1.0, "ToolEnv's own tool-call count, logged too"
        assert step["rollout/reward/verifiers.turn_rewards"] == 0.5, "the sum of the step rewards, logged too"
        # the call, then the answer after the tool's turn: two gateway calls, one sample, no branch
        assert (step["rollout/agent/calls_mean"], step["rollout/agent/samples_mean"],
                step["rollout/agent/branches_mean"]) == (2.0, 1.0, 0.0)
        assert step["train/logprob_abs_diff_mean"] <= 1e-4, "trained on the engine's log-probs of every turn"

    store = RolloutStore(saved)
    tokenizer = next(iter(engine.tokenizers.values()))
    for rollout_id in (0, 1):
        for sample in store.load(rollout_id).samples:
            prompt, response = sample.prompt_tokens, sample.response_tokens
            a, b = (int(x) for x in QUESTION.search(tokenizer.decode(prompt, skip_special_tokens=False)).groups())
            call, call_logprobs = next(answer for answer in engine.calls[tuple(prompt)]
                                       if response[:len(answer[0])] == answer[0])
            tool_turn = tokenizer.encode(f"<eos><tool>{a + b}<assistant>", add_special_tokens=False)
            assert response[len(call):len(call) + len(tool_turn)] == tool_turn, "the tool's answer, as rendered"
            second_prompt = tuple(prompt + call + tool_turn)
            rest = response[len(call) + len(tool_turn):]
            rest_logprobs = next(logprobs for ids, logprobs in engine.sampled[second_prompt] if ids == rest)
            assert sample.loss_mask == [1] * len(call) + [0] * len(tool_turn) + [1] * len(rest)
            assert sample.metadata["turn_rewards"] == [[0, 0.5], [len(call) + len(tool_turn), 0.0]], \
                "verifiers' step rewards, at the offsets of the call's and the answer's turns"
            assert sample.rollout_logprobs == call_logprobs + [0.0] * len(tool_turn) + rest_logprobs
            assert sample.reward_components["verifiers.add_calls"] == 1.0
            assert sample.reward_components["verifiers.exact"] == float(
                tokenizer.decode(rest, skip_special_tokens=True).strip() == str(a + b))
            assert sample.reward == sample.reward_components["verifiers"] == \
                sample.reward_components["verifiers.exact"]
