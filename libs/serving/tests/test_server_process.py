"""plasmid_serving.server_process, .http and .logprobs: the server-process lifecycle and HTTP helpers plasmid-vllm and
plasmid-sglang share, exercised with real processes (``python -m http.server``, a crashing
``python -c``) and without an inference engine."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from plasmid.errors import PlasmidError, ProviderError
from plasmid_serving.http import ServerUnreachable, control_answer, request, request_blocking
from plasmid_serving.logprobs import logprob_at_temperature
from plasmid_serving.server_process import ManagedServer, checkpoint_dtype, free_port, kill_group, spawn


@dataclass
class _Server(ManagedServer):
    """A ``ManagedServer`` running ``command``; ``GET /health`` is a file it serves."""

    command: list[str]
    log_path: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    label = "Toy"
    provider = "toy"
    plugin = "plasmid-toy"
    timeout_option = "--toy-startup-timeout"
    health_path = "/health"
    health_timeout = 5.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = spawn(self.command, self.log_path, "==== toy: start ====", os.environ)


class _Failed(PlasmidError):
    pass


def _http_server(root: Path, log: Path) -> _Server:
    port = free_port()
    (root / "health").write_text("ok")
    server = _Server([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                      str(root)], log, port=port)
    return server


@pytest.mark.timeout(60)
def test_a_server_is_healthy_then_stop_ends_its_whole_process_group(tmp_path):
    server = _http_server(tmp_path, tmp_path / "logs" / "server.log")
    (tmp_path / "logs").mkdir()
    server.start()
    try:
        server.wait_healthy(30)
        assert request_blocking(server.url, "/health", method="GET", timeout=5) == (200, "ok")
        if importlib.util.find_spec("aiohttp") is not None:  # the engine plugins' dependency, not the kernel's
            assert asyncio.run(request(server.url, "/health", method="GET", timeout=5)) == (200, "ok")
        status, _ = request_blocking(server.url, "/missing", method="GET", timeout=5)
        assert status == 404
        group = server.process.pid
    finally:
        server.stop(grace=5)
    assert server.process is None and not server.alive()
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    with pytest.raises(ServerUnreachable, match="GET"):
        request_blocking(server.url, "/health", method="GET", timeout=2)
    server.stop()  # twice is fine
    assert (tmp_path / "logs" / "server.log").read_text().startswith("\n==== toy: start ====\n")


@pytest.mark.timeout(60)
def test_a_frozen_server_answers_nothing_until_it_is_thawed(tmp_path):
    (tmp_path / "logs").mkdir()
    server = _http_server(tmp_path, tmp_path / "logs" / "server.log")
    server.start()
    try:
        server.wait_healthy(30)
        thaw = server.freeze()
        try:
            began = time.monotonic()
            with pytest.raises(ServerUnreachable):
                request_blocking(server.url, "/health", method="GET", timeout=1)
            assert time.monotonic() - began >= 0.9, "a frozen server accepts the connection and never answers"
        finally:
            thaw()
        thaw()  # twice is fine
        assert request_blocking(server.url, "/health", method="GET", timeout=5) == (200, "ok")
    finally:
        server.stop(grace=5)
    with pytest.raises(ProviderError, match=r"Toy server \(port \d+\) is not running: nothing to freeze"):
        server.freeze()


@pytest.mark.timeout(60)
def test_a_server_that_exits_while_starting_names_the_error_line_of_its_log(tmp_path):
    crash = "import sys; print('loading'); print('ValueError: no such model', flush=True); sys.exit(3)"
    server = _Server([sys.executable, "-c", crash], tmp_path / "server.log", port=free_port())
    server.start()
    with pytest.raises(ProviderError) as caught:
        server.wait_healthy(30)
    message = str(caught.value)
    assert message.startswith(f"Toy server (port {server.port}) exited with code 3 while starting: "
                              "ValueError: no such model\n")
    assert "loading" in message and caught.value.plugin == "plasmid-toy"


@pytest.mark.timeout(60)
def test_a_server_that_never_gets_healthy_is_stopped_and_the_message_names_the_option(tmp_path):
    server = _Server([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "server.log", port=free_port())
    server.start()
    started = time.monotonic()
    with pytest.raises(ProviderError, match=r"not healthy after 1 s \(raise --toy-startup-timeout\)"):
        server.wait_healthy(1)
    assert server.process is None and time.monotonic() - started < 20


@pytest.mark.timeout(30)
def test_kill_sigkills_the_group_and_kill_group_ignores_a_gone_group(tmp_path):
    server = _Server([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "server.log")
    server.start()
    server.kill()
    assert server.process.returncode == -signal.SIGKILL
    kill_group(server.process.pid)  # gone: no error


def test_log_error_and_log_tail_follow_the_class_settings(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("ok\n  torch.OutOfMemoryError: no memory\nIgnore import error: x\nmid\nsome error: lower\nend\n")

    class Strict(_Server):
        error_pattern = r"^\s*[\w.]*(Error|Exception): "
        error_match = True
        tail_skip = "Ignore import error"

    loose, strict = _Server([], log), Strict([], log)
    assert loose.log_error() == "some error: lower"
    assert strict.log_error() == "torch.OutOfMemoryError: no memory"
    assert loose.log_tail(3) == "mid\nsome error: lower\nend"
    assert strict.log_tail(4) == "  torch.OutOfMemoryError: no memory\nmid\nsome error: lower\nend"
    log.write_text("nothing here\n")
    assert loose.log_error() == "(no error line in the log)"
    missing = _Server([], tmp_path / "absent.log")
    assert missing.log_error() == "" and missing.log_tail() == "(no log)"


def test_control_answer_decodes_success_and_names_server_path_and_reason_on_failure():
    def call(status, text, **kw):
        return control_answer("http://h:1", "/x", status, text, server="Toy", error=_Failed, **kw)

    assert call(200, '{"success": true, "n": 1}') == {"success": True, "n": 1}
    assert call(200, "") == {}
    with pytest.raises(_Failed, match=r"^Toy server http://h:1: /x failed \(HTTP 200\): bad$"):
        call(200, '{"success": false, "message": "bad"}')
    with pytest.raises(_Failed, match=r"\(HTTP 500\): boom$"):
        call(500, '{"error": "boom"}')
    with pytest.raises(_Failed, match=r"\(HTTP 422\): \{\"detail\": \"d\"\}$"):
        call(422, json.dumps({"detail": "d"}))
    with pytest.raises(_Failed, match=r"\(HTTP 422\): d$"):
        call(422, json.dumps({"detail": "d"}), keys=("message", "error", "detail"))
    with pytest.raises(_Failed, match=r"\(HTTP 502\): \{\"n$"):
        call(502, '{"n": 1}', limit=3)
    with pytest.raises(_Failed, match=r"\(HTTP 502\): not json$"):  # not JSON: the body is the message
        call(502, " not json ", limit=3)


def test_checkpoint_dtype_is_the_configs_when_served_else_auto(tmp_path):
    served = ("float32", "bfloat16")
    assert checkpoint_dtype(tmp_path, served) == "auto"
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "torch.bfloat16"}))
    assert checkpoint_dtype(tmp_path, served) == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float16", "torch_dtype": "float32"}))
    assert checkpoint_dtype(tmp_path, served) == "auto"


def test_logprob_at_temperature_is_the_log_softmax_of_the_scaled_logits():
    logits = [0.5, -1.0, 2.0, 0.0]
    norm = math.log(sum(math.exp(x) for x in logits))
    logprobs = {t: x - norm for t, x in enumerate(logits)}
    for temperature in (0.5, 1.0, 1.7):
        scaled = [x / temperature for x in logits]
        expected = scaled[2] - math.log(sum(math.exp(x) for x in scaled))
        assert logprob_at_temperature(logprobs, 2, temperature) == pytest.approx(expected, abs=1e-12)
