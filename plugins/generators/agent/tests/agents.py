"""Agents used by the tests (``--agent plugins/generators/agent/tests/agents.py:answer``)."""

from openai import AsyncOpenAI


async def answer(session):
    """The README's ten-line agent: ask once, score the reply against the label."""
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    reply = await client.chat.completions.create(model=session.model, messages=session.messages, logprobs=True)
    return float((reply.choices[0].message.content or "").strip() == str(session.label))


async def two_turns(session):
    """A second turn after the first reply: the first call plain, the second streamed, both with logprobs."""
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    messages = list(session.messages)
    first = await client.chat.completions.create(model=session.model, messages=messages, logprobs=True, max_tokens=3)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "1+1="}]
    stream = await client.chat.completions.create(model=session.model, messages=messages, logprobs=True, max_tokens=3,
                                                  stream=True)
    chunks = [chunk async for chunk in stream]
    session.metadata["replies"] = [first, chunks]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return {"second": float(text == "2"), "calls": 2.0}


async def complete_the_prompt(session):
    """One ``/v1/completions`` call on the prompt's text (for a tokenizer without a chat template)."""
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    reply = await client.completions.create(model=session.model, prompt=session.messages[-1]["content"])
    return float(reply.choices[0].finish_reason == "stop")


async def stop_on_digits(session):
    """One chat call with stop strings (the tiny model's alphabet): the engine should stop on them."""
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    reply = await client.chat.completions.create(model=session.model, messages=session.messages, max_tokens=24,
                                                 stop=["1", "23", "=>"])
    session.metadata["reply"] = reply
    return float(reply.choices[0].finish_reason == "stop")


async def two_calls_rewarded_per_call(session):
    """Two chat calls, the second on the first's reply and a new question (one sample), and one
    reward per call: the first call earns 0, the second 1."""
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    messages = list(session.messages)
    first = await client.chat.completions.create(model=session.model, messages=messages, max_tokens=3)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "1+1="}]
    await client.chat.completions.create(model=session.model, messages=messages, max_tokens=3)
    return [0.0, 1.0]
