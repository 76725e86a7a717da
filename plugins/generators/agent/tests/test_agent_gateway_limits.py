"""The gateway under hostile clients, over raw sockets: the key is checked from the head before
any body is read; body, header and idle limits answer 413/431/408; bad framing is a 400, never a
traceback in the log; HTTP/1.0 connections are closed after the answer. Options: bad values are
one-line usage errors (``plasmid train``: exit 2, nothing written)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import plasmid_agent.plugin
import pytest
from plasmid_agent.gateway import Gateway
from plasmid_agent.generate import AgentGenerate
from plasmid_agent.httpserver import Limits
from plasmid_e2e import run_plasmid

from plasmid.errors import UsageError
from plasmid.testing import build, make_config
from plasmid.types import SamplingParams

AGENTS = Path(__file__).parent / "agents.py"
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=20, stop_token_ids=(2,), seed=7)


class NoEngine:
    """An engine never reached: every request here is refused before a model call."""

    weight_version = 0

    async def generate(self, prompt_ids, params):
        raise AssertionError("the engine must not be called")


def exchange(raw: bytes, *, limits: Limits | None = None, wait: float = 5.0, key: bool = True,
             pause: float = 0.0, then: bytes = b"") -> tuple[bytes, bool, float, list[str]]:
    """Send ``raw`` (``{key}`` replaced by an open rollout's key), optionally ``then`` after
    ``pause`` seconds, to a fresh gateway; ``(what came back, whether the gateway closed the
    connection within wait seconds, seconds taken, the rollout's errors)``."""

    async def main():
        gateway = Gateway(tokenizer=None, limits=limits)
        await gateway.start()
        rollout = gateway.open(NoEngine(), PARAMS)
        data = raw.replace(b"{key}", rollout.key.encode() if key else b"plasmid-unknown")
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        started = time.monotonic()
        writer.write(data)
        if pause:
            await asyncio.sleep(pause)
            try:
                writer.write(then)
                await writer.drain()
            except ConnectionError:
                pass
        got, closed = b"", False
        try:
            async with asyncio.timeout(wait):
                while chunk := await reader.read(1 << 16):
                    got += chunk
                closed = True
        except TimeoutError:
            pass
        except ConnectionError:
            closed = True
        seconds = time.monotonic() - started
        writer.close()
        await gateway.stop()
        return got, closed, seconds, list(rollout.errors)

    return asyncio.run(main())


def status_of(got: bytes) -> int:
    return int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0


def post(path: bytes, headers: bytes = b"", body: bytes = b"", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + headers + b"Content-Length: %d\r\n\r\n" % size + body)


def test_an_unknown_key_is_refused_from_the_head_without_reading_the_body():
    """60 MB announced, nothing sent: the 401 comes at once and the connection is closed."""
    got, closed, seconds, _ = exchange(post(b"/v1/chat/completions", b"Authorization: Bearer {key}\r\n",
                                            length=60 << 20), key=False)
    assert status_of(got) == 401 and b"unknown or finished session key" in got
    assert closed and seconds < 2.0
    got, closed, _, _ = exchange(post(b"/s/{key}/v1/chat/completions", length=60 << 20), key=False)
    assert status_of(got) == 401 and closed


def test_a_body_over_the_limit_is_refused_413_unread_and_named_for_the_agent():
    got, closed, seconds, errors = exchange(post(b"/s/{key}/v1/chat/completions", length=5000),
                                            limits=Limits(max_body=4096))
    assert status_of(got) == 413 and b"--agent-max-body" in got and closed and seconds < 2.0
    assert errors == ["request body of 5000 bytes is over 4096 (--agent-max-body)"]


def test_a_two_million_character_message_is_refused_by_the_body_limit_at_once():
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 2_000_000}]}).encode()
    got, closed, seconds, _ = exchange(post(b"/s/{key}/v1/chat/completions", body=body))
    assert status_of(got) == 413 and closed and seconds < 2.0


def test_a_chunked_body_over_the_limit_is_refused_413():
    chunk = b"x" * 3000
    raw = (b"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
           + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 2 + b"0\r\n\r\n")
    got, closed, _, _ = exchange(raw, limits=Limits(max_body=4096))
    assert status_of(got) == 413 and closed


@pytest.mark.parametrize("headers", [
    b"".join(b"X-Filler-%d: y\r\n" % i for i in range(150)),     # too many fields
    b"X-Big: " + b"y" * (80 << 10) + b"\r\n",                      # one huge field
    b"".join(b"X-F%d: " % i + b"y" * 1000 + b"\r\n" for i in range(70)),  # too many bytes in all
])
def test_too_many_or_too_large_headers_are_answered_431(headers):
    got, closed, _, _ = exchange(post(b"/s/{key}/v1/chat/completions", headers, b"{}"))
    assert status_of(got) == 431 and closed


def test_an_idle_connection_is_closed_and_a_stalled_request_gets_408():
    got, closed, seconds, _ = exchange(b"", limits=Limits(idle_timeout=0.3))
    assert got == b"" and closed and seconds < 2.0
    got, closed, seconds, _ = exchange(b"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
                                       limits=Limits(idle_timeout=0.3))
    assert status_of(got) == 408 and closed and seconds < 2.0
    got, closed, _, _ = exchange(post(b"/s/{key}/v1/chat/completions", length=100, body=b"{"),
                                 limits=Limits(idle_timeout=0.3))
    assert status_of(got) == 408 and closed


@pytest.mark.parametrize("raw", [
    post(b"/s/{key}/v1/chat/completions").replace(b"Content-Length: 0", b"Content-Length: abc"),
    post(b"/s/{key}/v1/chat/completions").replace(b"Content-Length: 0", b"Content-Length: -5"),
    post(b"/s/{key}/v1/chat/completions").replace(b"Content-Length: 0", b"Content-Length: 1e3"),
    post(b"/s/{key}/v1/chat/completions", b"Content-Length: 7\r\n", b"{}"),
    post(b"/s/{key}/v1/chat/completions", b"Transfer-Encoding: chunked\r\n", b"{}"),
    b"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
    b"POST /s/{key}/v1/chat/completions HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GARBAGE\r\n\r\n",
], ids=["letters", "negative", "float", "two-lengths", "length-and-chunked", "bad-chunk-size", "bad-chunk-end",
        "bad-header", "bad-request-line"])
def test_bad_framing_is_a_400_answer_and_never_a_traceback_in_the_log(raw, caplog):
    caplog.set_level(logging.DEBUG)
    got, closed, _, _ = exchange(raw)
    assert status_of(got) == 400 and closed
    logged = [logging.Formatter().format(record) for record in caplog.records if record.levelno >= logging.WARNING]
    # (other tests' clients, collected now, may log their own; none may come from the gateway's connections)
    assert not [text for text in logged if "client_connected_cb" in text or "plasmid_agent" in text], logged


def test_an_http_1_0_connection_is_closed_after_the_answer():
    got, closed, seconds, _ = exchange(b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert status_of(got) == 200 and b"Connection: close" in got and closed and seconds < 2.0
    got, closed, _, _ = exchange(b"GET /v1/models HTTP/1.1\r\n\r\n", wait=0.5)
    assert status_of(got) == 200 and not closed  # HTTP/1.1 keeps it alive


def test_the_limits_come_from_the_options():
    config = make_config(plasmid_agent.plugin, generate="agent", agent=f"{AGENTS}:answer", agent_max_body=2048,
                         agent_max_header_bytes=4096, agent_max_headers=7, agent_idle_timeout=1.5)
    generate: AgentGenerate = build("generate", "agent", plasmid_agent.plugin, config=config)
    assert generate.limits == Limits(max_body=2048, max_header_bytes=4096, max_headers=7, idle_timeout=1.5)
    assert AgentGenerate(make_config(plasmid_agent.plugin, generate="agent",
                                     agent=f"{AGENTS}:answer")).limits == Limits()


BAD_OPTIONS = [
    ("--agent-max-body", "0", "--agent-max-body 0: must be >= 1024"),
    ("--agent-max-body", "lots", "--agent-max-body: expected int, got 'lots'"),
    ("--agent-max-header-bytes", "10", "--agent-max-header-bytes 10: must be >= 1024"),
    ("--agent-max-headers", "0", "--agent-max-headers 0: must be >= 1"),
    ("--agent-idle-timeout", "0", "--agent-idle-timeout 0.0: must be > 0"),
    ("--agent-idle-timeout", "inf", "--agent-idle-timeout: expected a finite number, got inf"),
]


@pytest.mark.parametrize(("flag", "value", "message"), BAD_OPTIONS)
def test_bad_limit_values_are_one_line_usage_errors(flag, value, message):
    name = flag[2:].replace("-", "_")
    raw = float(value) if value in ("0", "inf") and "timeout" in flag else value
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_agent.plugin, generate="agent", agent=f"{AGENTS}:answer", **{name: raw})
    assert str(raised.value) == message


@pytest.mark.parametrize(("flag", "value", "message"), BAD_OPTIONS[::2] + BAD_OPTIONS[-1:])
def test_plasmid_train_with_a_bad_limit_exits_2_in_one_line_writing_nothing(tmp_path, flag, value, message):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", "--generate", "agent", "--agent", f"{AGENTS}:answer", f"{flag}={value}",
                       "--num-rollouts", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"plasmid: error: {flag}"), proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()
