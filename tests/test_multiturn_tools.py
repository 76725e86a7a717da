"""``--generate multiturn --tools calculator,python`` (the README's multi-turn command) with the
installed plugins: start-up builds both tools (the calculator of plasmid-basic-tools, the python
tool that runs code in plasmid-code's sandbox, the code reward's), and one conversation on a
scripted engine calls each through the multi-turn loop: their real answers are appended, masked,
and the model's turns around them are kept exactly as the engine generated them."""

from __future__ import annotations

import asyncio
import json
import string

import pytest

from plasmid.context import RolloutContext
from plasmid.session import build_tools, instantiate
from plasmid.startup import start
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status


def tool_call(name: str, **arguments: str) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def tool_answer(text: str) -> str:
    return f"<tool_response>{text}</tool_response>"


@pytest.mark.timeout(120)
def test_the_python_and_calculator_tools_answer_through_the_multiturn_loop(tmp_path):
    from plasmid_torch.tiny import char_tokenizer

    startup = start(["--generate", "multiturn", "--tools", "calculator,python", "--run-dir", str(tmp_path / "run")])
    config, registry = startup.config, startup.registry
    tools = build_tools(config, registry)
    assert list(tools) == ["calculator", "python"]
    assert type(tools["python"]).__module__ == "plasmid_code.tool"

    tokenizer = char_tokenizer(string.printable, max_length=4096)
    eos = tokenizer.eos_token_id

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    turns = [ids("Let me compute. " + tool_call("python", code="total = sum(range(10))\nprint(total * 2)")),
             ids(tool_call("calculator", expression="90 * 3")),
             ids("270") + [eos]]
    engine = ScriptedEngine([Reply(turn) for turn in turns])
    generate = instantiate(registry.get("generate", "multiturn"), config)
    ctx = RolloutContext(config=config, engines=[engine], data_source=None, tokenizer=tokenizer, generate=generate,
                         rewards=None, tools=tools)
    prompt = ids("What is 3 times twice the sum of 0..9? ")
    sample = Sample(prompt="", tokens=list(prompt), index=0, group_index=0)
    done = asyncio.run(generate(ctx, sample, SamplingParams(max_new_tokens=200, stop_token_ids=(eos,))))

    answers = [ids(tool_answer("90")), ids(tool_answer("270"))]
    assert done.status == Status.COMPLETED
    assert done.tokens == prompt + turns[0] + answers[0] + turns[1] + answers[1] + turns[2]
    assert done.loss_mask == ([1] * len(turns[0]) + [0] * len(answers[0]) + [1] * len(turns[1])
                              + [0] * len(answers[1]) + [1] * len(turns[2]))
    assert [call.prompt_ids for call in engine.calls] == [prompt, prompt + turns[0] + answers[0],
                                                          prompt + turns[0] + answers[0] + turns[1] + answers[1]]
    metrics = done.metadata["rollout_metrics"]
    assert (metrics["turns_mean"], metrics["tool_calls_mean"], metrics["tool_errors_mean"]) == (3.0, 2.0, 0.0)
    assert metrics["tool_seconds_mean"] > 0
