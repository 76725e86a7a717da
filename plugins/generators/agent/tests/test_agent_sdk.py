"""The OpenAI Agents SDK (``openai-agents``) against the gateway: an agent with one function tool,
run with the SDK's default model class (``OpenAIResponsesModel``, ``/v1/responses``) and with
``OpenAIChatCompletionsModel``, streamed and not; and ``/v1/responses`` on raw HTTP (its shapes,
its bad values)."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import ScriptedEngine
from openai import AsyncOpenAI
from test_agent_protocol import CALCULATOR, TOOL_REPLY, http, run_agent

from plasmid.testing.conversation import EngineCall, check_token_in_token_out
from plasmid.types import GenerationOutput, Sample, Status

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (pip install openai-agents)")


@pytest.fixture(autouse=True, scope="module")
def no_tracing():
    """The SDK exports traces to OpenAI unless told not to; these runs stay on the machine."""
    agents.set_tracing_disabled(True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model_class", ["OpenAIResponsesModel", "OpenAIChatCompletionsModel"])
def test_an_agents_sdk_agent_with_a_function_tool_trains_on_one_sample_of_the_engines_tokens(
        tmp_path, tool_tokenizer, model_class, stream):
    engine = ScriptedEngine(tool_tokenizer, [TOOL_REPLY, "it is 6<eos>"])
    tool_inputs = []

    @agents.function_tool
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        tool_inputs.append(expression)
        return "6" if expression == "2*3" else "?"

    async def agent(session):
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        model = getattr(agents, model_class)(model=session.model, openai_client=client)
        bot = agents.Agent(name="calc", instructions="use the calculator", model=model, tools=[calculator])
        question = session.messages[-1]["content"]
        if stream:
            result = agents.Runner.run_streamed(bot, question)
            events = [event.type async for event in result.stream_events()]
            assert "raw_response_event" in events
        else:
            result = await agents.Runner.run(bot, question)
        return float(result.final_output == "it is 6")

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert tool_inputs == ["2*3"], "the SDK got the parsed call and ran the tool"
    assert isinstance(out, Sample) and out.metadata["agent_reward"] == 1.0
    (prompt1, params1), (prompt2, params2) = engine.seen
    assert tool_tokenizer.decode(prompt1) == "<bos><system>use the calculator<user>what is 2*3<assistant>"
    reply1, reply2 = engine.replies
    tool_turn = prompt2[len(prompt1) + len(reply1):]
    assert tool_tokenizer.decode(tool_turn) == "<tool>6<assistant>"
    calls = [EngineCall(prompt1, params1, GenerationOutput(reply1, [-0.01 * (i + 1) for i in range(len(reply1))],
                                                           Status.COMPLETED, 3)),
             EngineCall(prompt2, params2, GenerationOutput(reply2, [-0.02 * (i + 1) for i in range(len(reply2))],
                                                           Status.COMPLETED, 3))]
    check_token_in_token_out(out, calls, environment=[tool_turn])


def test_responses_answers_text_and_function_calls_in_the_shapes_of_the_openai_client(tmp_path, tool_tokenizer):
    engine = ScriptedEngine(tool_tokenizer, [TOOL_REPLY, "it is 6<eos>", "it is"],
                            statuses=[Status.COMPLETED, Status.COMPLETED, Status.TRUNCATED])
    seen = {}

    async def agent(session):
        client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
        first = await client.responses.create(model=session.model, input="what is 2*3", tools=[
            {"type": "function", "name": "calculator", "parameters": CALCULATOR["function"]["parameters"]}])
        call = first.output[0]
        seen["call"] = (call.type, call.name, json.loads(call.arguments), call.call_id.startswith("call_"))
        second = await client.responses.create(model=session.model, input=[
            {"role": "user", "content": "what is 2*3"}, call.model_dump(),
            {"type": "function_call_output", "call_id": call.call_id, "output": "6"}], tools=[
            {"type": "function", "name": "calculator"}])
        seen["text"], seen["usage"] = second.output_text, second.usage
        short = await client.responses.create(model=session.model, input="x", max_output_tokens=2)
        seen["short"] = (short.status, short.incomplete_details.reason, short.output_text)
        return 1.0

    out = run_agent(tmp_path, agent, tool_tokenizer, engine)
    assert seen["call"] == ("function_call", "calculator", {"expression": "2*3"}, True)
    assert seen["text"] == "it is 6"
    assert seen["usage"].input_tokens == len(engine.seen[1][0]) and seen["usage"].output_tokens == len(
        engine.replies[1])
    assert seen["short"] == ("incomplete", "max_output_tokens", "it")
    assert engine.seen[2][1].max_new_tokens == 2
    assert isinstance(out, list) and out[0].tokens == engine.seen[1][0] + engine.replies[1], \
        "the function_call item renders as the model wrote it: one sample"


@pytest.mark.parametrize(("fields", "message"), [
    ({"input": 5}, "'input' must be a string or a non-empty list of items"),
    ({"input": [{"role": "robot", "content": "x"}]}, "'input[0].role' must be one of system, developer, user"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "'input[0].content[0].image_url' must be a data URL string"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
     "'input[0].content[0]' must be an input_text or output_text part"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]},
     "'input[0].content[0]' is an image, but the model 'plasmid' (the policy) is not a vision-language model"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "'input[0].arguments' must be a string"),
    ({"input": [{"type": "computer_call"}]}, "'input[0].type' 'computer_call' is not supported"),
    ({"tools": [{"type": "web_search"}]}, "'tools[0]' of type 'web_search' is not supported"),
    ({"tools": [{"type": "function", "name": ""}]}, "'tools[0].function.name' must be a non-empty string"),
    ({"tool_choice": "required"}, "'tool_choice' required is not supported"),
    ({"text": {"format": {"type": "json_schema"}}}, "'text.format' 'json_schema' is not supported"),
    ({"previous_response_id": "resp_1"}, "'previous_response_id' is not supported"),
    ({"max_output_tokens": 0}, "'max_output_tokens' must be an integer >= 1"),
    ({"temperature": "warm"}, "'temperature' must be a number from 0 to 2"),
    ({"stream": 1}, "'stream' must be true or false"),
    ({"instructions": ["be brief"]}, "'instructions' must be a string"),
    ({"parallel_tool_calls": False}, "'parallel_tool_calls': false is not supported"),
])
def test_a_bad_or_unsupported_responses_field_is_a_400_naming_it(tmp_path, tool_tokenizer, fields, message):
    seen = {}

    async def agent(session):
        body = json.dumps({"model": session.model, "input": "hi", **fields}).encode()
        seen["answer"] = await asyncio.to_thread(http, session.base_url + "/responses", body)
        return 1.0

    with pytest.raises(Exception, match="made no model call"):
        run_agent(tmp_path, agent, tool_tokenizer, ScriptedEngine(tool_tokenizer, []))
    status, body = seen["answer"]
    assert status == 400 and message in body["error"]["message"], body
