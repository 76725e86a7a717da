"""The ``remote`` reward against a real HTTP server on 127.0.0.1, started by the tests.

The server (``http.server`` in a thread) scores a response by its length, or per the scenario a
test sets: failing with 500 a few times, answering too slowly, answering with something that is
not JSON, or echoing the Authorization header in an error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import plasmid_remote.plugin
import pytest
from plasmid_remote.transport import RemoteError, RemoteTimeout, RetryableError

from plasmid.errors import PlasmidError
from plasmid.rewards import RewardComponent, RewardSet
from plasmid.testing import RewardContract, build, make_config, run
from plasmid.types import Sample

TOKEN = "tok-3f9a7c1e55d2"


class Scenario:
    """What the server does next; the test sets it, the handler reads and records."""

    def __init__(self) -> None:
        self.fail_first = 0          # answer 500 to this many requests first
        self.delay = 0.0             # seconds to wait before answering
        self.not_json = False        # answer 200 with a body that is not JSON
        self.unauthorized = False    # answer 401 echoing the Authorization header
        self.reply: object = None    # a fixed reply instead of the length score
        self.requests: list[dict] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()


def score_of(body: dict) -> float:
    return float(len(body["response"]))


class Handler(BaseHTTPRequestHandler):
    scenario: Scenario

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_POST(self):
        scenario = self.scenario
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with scenario.lock:
            scenario.requests.append({"body": body, "authorization": self.headers.get("Authorization")})
            failing = len(scenario.requests) <= scenario.fail_first
            scenario.in_flight += 1
            scenario.most_in_flight = max(scenario.most_in_flight, scenario.in_flight)
        try:
            time.sleep(scenario.delay)
            status, payload = self._answer(scenario, body, failing)
        finally:
            # no longer in flight once the answer is decided: the client may send its next request
            # the moment the reply is written, before this thread could count this one out
            with scenario.lock:
                scenario.in_flight -= 1
        self._send(status, payload)

    def _answer(self, scenario: Scenario, body, failing: bool) -> tuple[int, bytes]:
        if failing:
            return 500, b"overloaded"
        if scenario.unauthorized:
            return 401, f"bad credentials: {self.headers.get('Authorization')}".encode()
        if scenario.not_json:
            return 200, b"<html>oops</html>"
        if scenario.reply is not None:
            reply = scenario.reply
        elif isinstance(body, list):
            reply = [score_of(item) for item in body]
        else:
            reply = score_of(body)
        return 200, json.dumps(reply).encode()

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def server():
    scenario = Scenario()
    handler = type("ScenarioHandler", (Handler,), {"scenario": scenario})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    scenario.url = f"http://127.0.0.1:{httpd.server_address[1]}/score"
    yield scenario
    httpd.shutdown()
    httpd.server_close()


def remote(scenario, **options):
    options = {"rm_url": scenario.url, "rm_backoff": 0.01, "rm_timeout": 5.0, **options}
    return build("reward", "remote", plasmid_remote.plugin, config=make_config(plasmid_remote.plugin, **options))


def sample(response="abc", **fields):
    return Sample(prompt="2+2=", response=response, label="4", metadata={"source": "test"}, **fields)


@pytest.fixture(scope="module")
def contract_server():
    scenario = Scenario()
    handler = type("ContractHandler", (Handler,), {"scenario": scenario})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/score"
    httpd.shutdown()
    httpd.server_close()


class TestRemoteContract(RewardContract):
    plugin = plasmid_remote.plugin
    provider = "remote"

    @pytest.fixture
    def config(self, tmp_path, contract_server):
        return make_config(self.plugin, run_dir=tmp_path / "run", rm_url=contract_server)


class TestBatchedRemoteContract(TestRemoteContract):
    @pytest.fixture
    def config(self, tmp_path, contract_server):
        return make_config(self.plugin, run_dir=tmp_path / "run", rm_url=contract_server, rm_batch_size=4)


def test_the_request_carries_prompt_response_label_and_metadata(server):
    assert run(remote(server)(sample("hello"))) == 5.0
    assert server.requests[0]["body"] == {"prompt": "2+2=", "response": "hello", "label": "4",
                                          "metadata": {"source": "test"}}
    assert server.requests[0]["authorization"] is None


def test_a_dict_reply_is_returned_for_reward_key_to_pick(server):
    server.reply = {"correct": 1.0, "style": 0.25}
    fn = remote(server)
    assert run(fn(sample())) == {"correct": 1.0, "style": 0.25}
    rewards = RewardSet([RewardComponent("remote", 1.0, fn, plugin="remote")], reward_key="style", errors="fail")
    scored = [sample()]
    run(rewards.score_group(scored))
    assert scored[0].reward == 0.25


def test_server_errors_are_retried_with_backoff_until_it_answers(server):
    server.fail_first = 2
    started = time.perf_counter()
    assert run(remote(server, rm_retries=3, rm_backoff=0.1)(sample("abcd"))) == 4.0
    assert len(server.requests) == 3
    assert time.perf_counter() - started >= 0.1 + 0.2  # waited 0.1 s, then 0.2 s


def test_it_gives_up_after_the_retries_naming_the_status(server):
    server.fail_first = 10
    with pytest.raises(RetryableError, match=r"HTTP 500.*gave up after 3 attempts"):
        run(remote(server, rm_retries=2)(sample()))
    assert len(server.requests) == 3


def test_connection_errors_are_retried_too():
    config = make_config(plasmid_remote.plugin, rm_url="http://127.0.0.1:9/score", rm_retries=2, rm_backoff=0.01)
    fn = build("reward", "remote", plasmid_remote.plugin, config=config)
    with pytest.raises(RetryableError, match="gave up after 3 attempts"):
        run(fn(sample()))


def test_a_slow_server_times_out_without_retrying(server):
    server.delay = 1.0
    started = time.perf_counter()
    with pytest.raises(RemoteTimeout, match="no answer within 0.2s"):
        run(remote(server, rm_timeout=0.2)(sample()))
    assert time.perf_counter() - started < 0.9
    assert len(server.requests) == 1


def test_a_reply_that_is_not_json_is_an_error_quoting_it(server):
    server.not_json = True
    with pytest.raises(RemoteError, match="not JSON: '<html>oops</html>'"):
        run(remote(server)(sample()))
    assert len(server.requests) == 1


@pytest.mark.parametrize("reply", [True, "0.5", [1.0], {}, {"a": "x"}])
def test_a_reply_that_is_not_a_score_is_an_error(server, reply):
    server.reply = reply
    with pytest.raises(RemoteError, match="expected a number or an object of numbers"):
        run(remote(server)(sample()))


def test_the_token_is_sent_and_never_shown(server, monkeypatch, caplog):
    monkeypatch.setenv("RM_TOKEN", TOKEN)
    fn = remote(server, rm_token_env="RM_TOKEN", rm_retries=1)
    caplog.set_level(logging.DEBUG)
    assert run(fn(sample("xy"))) == 2.0
    assert server.requests[-1]["authorization"] == f"Bearer {TOKEN}"

    server.unauthorized = True  # the server echoes the header back in its error
    with pytest.raises(RemoteError) as error:
        run(fn(sample()))
    assert "HTTP 401" in str(error.value) and "***" in str(error.value)
    server.unauthorized, server.fail_first = False, len(server.requests) + 5
    with pytest.raises(RetryableError) as retried:
        run(fn(sample()))
    shown = [str(error.value), str(retried.value), repr(fn), caplog.text]
    assert caplog.records, "the retry should have been logged"
    assert all(TOKEN not in text for text in shown)


def test_a_missing_token_variable_or_url_is_a_usage_error(server, monkeypatch):
    monkeypatch.delenv("RM_TOKEN", raising=False)
    with pytest.raises(PlasmidError, match="--rm-token-env RM_TOKEN"):
        remote(server, rm_token_env="RM_TOKEN")
    with pytest.raises(PlasmidError, match="needs --rm-url"):
        build("reward", "remote", plasmid_remote.plugin, config=make_config(plasmid_remote.plugin))


def test_credentials_in_the_url_are_not_shown(server):
    server.not_json = True
    url = server.url.replace("http://", "http://user:hunter2@") + "?key=secret"
    with pytest.raises((RemoteError, RetryableError)) as error:
        run(remote(server, rm_url=url, rm_retries=0)(sample()))
    assert "hunter2" not in str(error.value) and "secret" not in str(error.value)


def test_concurrent_calls_are_batched_up_to_the_batch_size(server):
    fn = remote(server, rm_batch_size=4, rm_batch_window=0.2)

    async def ten_at_once():
        return await asyncio.gather(*(fn(sample("x" * n)) for n in range(10)))

    assert run(ten_at_once()) == [float(n) for n in range(10)]
    sizes = [len(request["body"]) for request in server.requests]
    assert sorted(sizes, reverse=True) == [4, 4, 2]
    assert all(isinstance(request["body"], list) for request in server.requests)


def test_a_lone_call_is_sent_after_the_batch_window(server):
    fn = remote(server, rm_batch_size=8, rm_batch_window=0.05)
    assert run(fn(sample("abc"))) == 3.0
    assert [len(request["body"]) for request in server.requests] == [1]


def test_a_batch_reply_of_the_wrong_length_fails_every_call_in_it(server):
    server.reply = [1.0]
    fn = remote(server, rm_batch_size=2, rm_batch_window=0.2)

    async def two():
        return await asyncio.gather(fn(sample("a")), fn(sample("b")), return_exceptions=True)

    results = run(two())
    assert all(isinstance(result, RemoteError) and "expected a list of 2 results" in str(result)
               for result in results)


def test_at_most_rm_concurrency_requests_are_in_flight(server):
    server.delay = 0.1
    fn = remote(server, rm_concurrency=2)

    async def six():
        return await asyncio.gather(*(fn(sample()) for _ in range(6)))

    assert run(six()) == [3.0] * 6
    assert server.most_in_flight == 2


def test_failures_reach_the_reward_set_with_the_plugin_name(server):
    server.not_json = True
    rewards = RewardSet([RewardComponent("remote", 1.0, remote(server), plugin="'remote' (plasmid-remote)")])
    scored = [sample()]
    run(rewards.score_group(scored))
    assert scored[0].reward == 0.0
    assert rewards.pop_metrics() == {"reward/failed/remote: RemoteError": 1.0}
