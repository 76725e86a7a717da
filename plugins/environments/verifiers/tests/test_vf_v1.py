"""A verifiers v1 taskset (``vf_plasmid_v1_sum`` of tests/fixtures/plasmid-vf-fixtures) in
``plasmid train --datasource verifiers``: verifiers' own v1 environment runs each task's episode,
its agent the in-process chat loop of ``plasmid_verifiers_harness``, whose model calls reach the
engine through verifiers' interception and plasmid-agent's gateway; the task's ``@vf.reward``
methods are the reward, exactly as verifiers scores the trace."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict

import pytest

from plasmid.app.cli import main
from plasmid.app.rollout_store import RolloutStore
from plasmid.types import GenerationOutput, Status

#: The end of a task's prompt as the recipe's chat template renders it.
QUESTION = re.compile(r"<user>(\d)\+(\d)=<assistant>$")


def answer(a: int, b: int) -> str:
    """What the stand-in engine answers: the sum when ``a`` is even, else a wrong, long reply."""
    return str(a + b) if a % 2 == 0 else "no idea"


def expected(a: int, b: int) -> tuple[float, dict[str, float]]:
    """The fixture task's reward of :func:`answer`: exact (weight 1) + short (weight 0.5), and its metric."""
    reply = answer(a, b)
    exact, short = float(reply == str(a + b)), float(len(reply) <= 2)
    return exact + 0.5 * short, {"exact": exact, "short": short, "reply_chars": float(len(reply))}


@pytest.mark.timeout(300)
def test_plasmid_train_with_a_v1_taskset_scores_each_episode_as_verifiers_does(tmp_path, capsys, monkeypatch):
    from plasmid_torchgen.engine import TorchEngine

    from plasmid_torch.hf import load_tokenizer

    answered: list[tuple[list[int], list[int], list[float]]] = []

    async def generate(self, prompt_ids, params):
        tokenizer = load_tokenizer(self.model_path)
        question = QUESTION.search(tokenizer.decode(prompt_ids, skip_special_tokens=False))
        assert question is not None, "one call per episode, on the task's prompt"
        ids = tokenizer.encode(answer(*map(int, question.groups())), add_special_tokens=False) + [
            tokenizer.eos_token_id]
        logprobs = await self.score(list(prompt_ids) + ids, len(prompt_ids), params.temperature)
        answered.append((list(prompt_ids), ids, logprobs))
        return GenerationOutput(ids, logprobs, Status.COMPLETED, self.weight_version)

    monkeypatch.setattr(TorchEngine, "generate", generate)
    run_dir, saved = tmp_path / "run", tmp_path / "rollouts"
    code = main(["train", "--datasource", "verifiers", "--vf-env", "vf_plasmid_v1_sum", "--vf-env-args",
                 '{"size": 10}', "--num-rollouts", "2", "--prompts-per-step", "2", "--n-samples-per-prompt", "2",
                 "--eval-interval", "0", "--save-interval", "0", "--run-dir", str(run_dir),
                 "--save-rollouts", str(saved)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "datasource=verifiers" in err and "generate=agent" in err and "reward=verifiers" in err
    assert len(answered) == 8, "one model call for each of the 2 x 4 episodes"

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert step["train/samples"] == 4.0 and step["rollout/agent/calls_mean"] == 1.0
        assert {"rollout/reward/verifiers.exact", "rollout/reward/verifiers.short",
                "rollout/reward/verifiers.reply_chars"} <= set(step), "each reward and metric is logged"
        assert step["train/logprob_abs_diff_mean"] <= 1e-4, "trained on the engine's log-probs"

    store = RolloutStore(saved)
    tokenizer = load_tokenizer(str(run_dir / "model"))
    seen = set()
    for rollout_id in (0, 1):
        for sample in store.load(rollout_id).samples:
            a, b = map(int, QUESTION.search(tokenizer.decode(sample.prompt_tokens,
                                                             skip_special_tokens=False)).groups())
            prompt = sample.prompt_tokens
            assert tokenizer.decode(prompt, skip_special_tokens=False) == \
                f"{tokenizer.bos_token}<system>Answer with the sum.<user>{a}+{b}=<assistant>", \
                "the task's system prompt, then its prompt"
            assert (prompt, sample.response_tokens, sample.rollout_logprobs) in answered, \
                "the engine's answer and log-probs (one prompt's two answers may differ in the last bits)"
            assert sample.loss_mask == [1] * len(sample.response_tokens)
            reward, parts = expected(a, b)
            assert sample.reward == reward == sample.reward_components["verifiers"]
            assert {name: sample.reward_components[f"verifiers.{name}"] for name in parts} == parts
            seen.add(a % 2)
    assert seen == {0, 1}, "both a rewarded and an unrewarded answer were scored"


def test_v1_tasksets_rows_and_bad_config_in_one_line():
    from plasmid_verifiers import vf

    from plasmid.errors import UsageError

    taskset = vf.load_env("vf_plasmid_v1_sum", vf.canonical_args({"size": 3}))
    assert vf.is_v1(taskset) and vf.tool_schemas(taskset) == []
    assert vf.dataset_rows(taskset, "train") == vf.dataset_rows(taskset, "eval") == [
        {"prompt": [{"role": "system", "content": "Answer with the sum."}, {"role": "user", "content": f"{a}+{b}="}],
         "task": k, "example_id": k} for k, (a, b) in enumerate([(0, 0), (1, 3), (2, 1)])]
    with pytest.raises(UsageError, match=r"^--vf-env vf_plasmid_v1_sum: verifiers could not load this v1 taskset "
                                         r"\(ValidationError: .*TasksetConfig"):
        vf.load_env("vf_plasmid_v1_sum", vf.canonical_args({"size": "many"}))


#: The end of a tool task's prompt (``a+b=``), and of the prompt after the tool's answer.
TOOL_QUESTION = re.compile(r"<user>(\d+)\+(\d+)=<assistant>$")
TOOL_ANSWERED = re.compile(r"<tool>(\d+)<assistant>$")


@pytest.mark.timeout(300)
def test_plasmid_train_with_a_v1_tool_taskset_masks_the_tool_turns(tmp_path, capsys, monkeypatch):
    """``vf_plasmid_v1_tool``: the first turn calls the task's MCP ``add`` tool, verifiers' tool server
    answers, the second turn replies the tool's result; one sample per episode, the tool turn masked,
    the engine's log-probs on both model turns, the reward verifiers' score of the trace."""
    from plasmid_torchgen.engine import TorchEngine

    from plasmid_torch.hf import load_tokenizer

    #: every answer by prompt ids (the log-probs of one prompt's answers may differ in the last bits: scored
    #: in other batches)
    answered: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = defaultdict(list)

    async def generate(self, prompt_ids, params):
        tokenizer = load_tokenizer(self.model_path)
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        if (question := TOOL_QUESTION.search(text)) is not None:
            a, b = question.groups()
            reply = f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
        else:
            reply = TOOL_ANSWERED.search(text).group(1)
        ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
        logprobs = await self.score(list(prompt_ids) + ids, len(prompt_ids), params.temperature)
        answered[tuple(prompt_ids)].append((ids, logprobs))
        return GenerationOutput(ids, logprobs, Status.COMPLETED, self.weight_version)

    monkeypatch.setattr(TorchEngine, "generate", generate)
    run_dir, saved = tmp_path / "run", tmp_path / "rollouts"
    code = main(["train", "--datasource", "verifiers", "--vf-env", "vf_plasmid_v1_tool", "--num-rollouts", "2",
                 "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--max-new-tokens", "128",
                 "--eval-interval", "0", "--save-interval", "0", "--run-dir", str(run_dir),
                 "--save-rollouts", str(saved)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert (step["rollout/agent/calls_mean"], step["rollout/agent/samples_mean"],
                step["rollout/agent/branches_mean"]) == (2.0, 1.0, 0.0), "the call, then the reply: one sample"
        assert step["rollout/reward/verifiers"] == 1.0 and step["rollout/reward/verifiers.tool_results"] == 1.0
        assert step["train/logprob_abs_diff_mean"] <= 1e-4

    store = RolloutStore(saved)
    tokenizer = load_tokenizer(str(run_dir / "model"))
    for rollout_id in (0, 1):
        for sample in store.load(rollout_id).samples:
            prompt, response = sample.prompt_tokens, sample.response_tokens
            a, b = map(int, TOOL_QUESTION.search(tokenizer.decode(prompt, skip_special_tokens=False)).groups())
            call = answered[tuple(prompt)][0][0]
            tool_turn = tokenizer.encode(f"<tool>{a + b}<assistant>", add_special_tokens=False)
            reply = answered[tuple(prompt + call + tool_turn)][0][0]
            assert response == call + tool_turn + reply, "the tool's answer as the template renders it"
            assert tokenizer.decode(reply, skip_special_tokens=True) == str(a + b)
            assert sample.loss_mask == [1] * len(call) + [0] * len(tool_turn) + [1] * len(reply)
            logprobs = sample.rollout_logprobs
            assert logprobs[len(call):len(call) + len(tool_turn)] == [0.0] * len(tool_turn)
            assert (call, logprobs[:len(call)]) in answered[tuple(prompt)], "the engine's log-probs of the call"
            assert (reply, logprobs[len(call) + len(tool_turn):]) in answered[tuple(prompt + call + tool_turn)]
            assert sample.reward == 1.0 and sample.reward_components["verifiers.exact"] == 1.0
            assert sample.reward_components["verifiers.tool_results"] == 1.0
            assert "turn_rewards" not in sample.metadata, "v1 rewards the whole trace, no turn"


OWN_ENV = '''
import verifiers.v1 as vf
from vf_plasmid_v1_sum import SumTaskset

__all__ = ["SumTaskset", "JudgedEnv"]


class JudgedEnv(vf.SingleAgentEnv):
    """An environment of the taskset's own (where a multi-agent taskset declares its roles)."""
'''

ENDLESS = '''
import verifiers.v1 as vf
from vf_plasmid_v1_sum import SumData, SumTask

__all__ = ["Endless"]


class Endless(vf.Taskset):
    INFINITE = True

    def load(self):
        while True:
            yield SumTask(SumData(prompt="1+1=", answer="2"))
'''


@pytest.mark.parametrize(("name", "source", "message"), [
    ("vf_plasmid_v1_own_env", OWN_ENV, r"the v1 taskset's package exports its own environment "
                                       r"\(vf_plasmid_v1_own_env\.JudgedEnv\); plasmid-verifiers runs v1 tasksets "
                                       r"in verifiers' SingleAgentEnv"),
    ("vf_plasmid_v1_endless", ENDLESS, r"the v1 taskset is infinite; plasmid-verifiers needs a finite one"),
])
def test_a_v1_taskset_this_adapter_cannot_run_is_one_line(tmp_path, monkeypatch, name, source, message):
    from plasmid_verifiers import vf

    from plasmid.errors import UsageError

    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    vf.load_env.cache_clear()
    try:
        with pytest.raises(UsageError, match=f"^--vf-env {name}: {message}"):
            vf.load_env(name)
    finally:
        vf.load_env.cache_clear()


STOPPING = '''
import verifiers.v1 as vf
from vf_plasmid_v1_tool import AddData, AddTask, AddTasksetConfig

__all__ = ["StoppingTaskset"]


class StoppingTask(AddTask):
    @vf.stop
    async def three_replies(self, trace: vf.Trace) -> bool:
        return len(trace.assistant_messages) >= 3


class StoppingTaskset(vf.Taskset[StoppingTask, AddTasksetConfig]):
    def load(self):
        yield StoppingTask(AddData(idx=0, prompt="10+20=", answer="30"), self.config.task)
'''


def tool_call(name: str, arguments: str) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"call-{name}", "type": "function", "function": {"name": name,
                                                                                   "arguments": arguments}}]}


@pytest.mark.timeout(120)
def test_the_harness_answers_bad_calls_and_ends_where_a_stop_refuses_the_turn(tmp_path, monkeypatch):
    """The in-process chat loop against a scripted OpenAI endpoint: arguments that are not JSON and an
    unknown tool are answered with an error the model reads, a good call with the MCP tool's result;
    the task's ``@vf.stop`` (three replies) refuses the fourth model call, which ends the episode
    cleanly, and verifiers scores the trace."""
    from aiohttp import web
    from plasmid_verifiers import vf

    (tmp_path / "vf_plasmid_v1_stopping.py").write_text(STOPPING)
    monkeypatch.syspath_prepend(str(tmp_path))
    replies = [tool_call("add", "{a: 1"), tool_call("mul", '{"a": 1}'), tool_call("add", '{"a": 10, "b": 20}'),
               {"role": "assistant", "content": "never asked for"}]
    requests: list[dict] = []

    async def chat(request):
        body = await request.json()
        requests.append(body)
        message = replies[len(requests) - 1]
        return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})

    async def episode():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            taskset = vf.load_env("vf_plasmid_v1_stopping")
            return await taskset.rollout(0, f"http://127.0.0.1:{port}/v1", "policy")
        finally:
            await runner.cleanup()

    vf.load_env.cache_clear()
    try:
        reward, parts = asyncio.run(episode())
    finally:
        vf.load_env.cache_clear()
    assert len(requests) == 3, "the fourth call is refused by the @stop before it reaches the model"
    tools = [message["content"] for message in requests[-1]["messages"] if message["role"] == "tool"]
    assert tools[0].startswith("error: the arguments are not JSON") and tools[1] == "error: unknown tool 'mul'"
    assert [tool["function"]["name"] for tool in requests[0]["tools"]] == ["add"]
    assert len(tools) == 2, "the third request holds the answers to the first two calls"
    # verifiers' trace holds what reached the model: the third call's answer went out only with the refused call
    assert (reward, parts) == (0.0, {"exact": 0.0, "tool_results": 2.0}), "scored on the trace the stop ended"
