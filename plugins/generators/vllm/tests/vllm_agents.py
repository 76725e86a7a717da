"""The agent of ``test_vllm_conversations`` (``--agent <this file>:two_turns``), through the real ``openai`` client."""

from openai import AsyncOpenAI


async def two_turns(session):
    """Ask, then ask again after the reply: the first call plain, the second streamed, both with log-probs."""
    client = AsyncOpenAI(base_url=session.base_url, api_key=session.api_key, max_retries=0)
    messages = list(session.messages)
    first = await client.chat.completions.create(model=session.model, messages=messages, logprobs=True, max_tokens=3)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "1+1="}]
    stream = await client.chat.completions.create(model=session.model, messages=messages, logprobs=True, max_tokens=3,
                                                  stream=True)
    chunks = [chunk async for chunk in stream]
    session.metadata["replies"] = [first, chunks]
    return 1.0
