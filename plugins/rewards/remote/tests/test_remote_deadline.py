"""``--rm-timeout`` is a deadline for the whole request, not for each read: a real asyncio server
on 127.0.0.1 that trickles its answer one byte at a time (each read well within the timeout) must
not hold a call past it, and a cancelled call (a stop) must free its thread at once."""

from __future__ import annotations

import asyncio
import threading
import time

import plasmid_remote.plugin
import pytest
from plasmid_remote.transport import Deadline, RemoteAborted, RemoteTimeout, post_json

from plasmid.testing import build, make_config, run
from plasmid.types import Sample

#: seconds between the bytes the slow server sends
TRICKLE = 0.05


class TrickleServer:
    """An asyncio HTTP server in its own thread that reads the request, then sends the answer
    one byte every :data:`TRICKLE` seconds: from the status line (``part="head"``) or after
    whole headers announcing a long body (``part="body"``)."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/score"
        self.started.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            body = b"1" * 400
            answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            if self.part == "body":
                writer.write(answer)
                answer = body
            else:
                answer += body
            for index in range(len(answer)):
                if writer.is_closing() or reader.at_eof():  # the client gave up
                    return
                writer.write(answer[index:index + 1])
                await writer.drain()
                await asyncio.sleep(TRICKLE)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture(params=["head", "body"])
def trickle(request):
    server = TrickleServer(request.param)
    yield server
    server.close()


def remote(url, **options):
    options = {"rm_url": url, "rm_retries": 0, **options}
    return build("reward", "remote", plasmid_remote.plugin, config=make_config(plasmid_remote.plugin, **options))


def sample():
    return Sample(prompt="2+2=", response="4", label="4", metadata={})


def test_a_server_trickling_its_answer_is_cut_off_at_rm_timeout_in_all(trickle):
    """Each byte comes 0.05 s after the last (every read well within 0.5 s); the whole answer
    would take 20 s. The call must end, as a time-out, at 0.5 s."""
    fn = remote(trickle.url, rm_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RemoteTimeout, match=r"no answer within 0.5s \(--rm-timeout"):
        run(fn(sample()))
    assert time.monotonic() - started < 2.0
    assert trickle.connections == 1


def test_post_json_alone_is_bounded_too(trickle):
    started = time.monotonic()
    with pytest.raises(RemoteTimeout):
        post_json(trickle.url, {"x": 1}, timeout=0.3)
    assert time.monotonic() - started < 1.5


def test_a_cancelled_call_frees_its_thread_within_a_second(trickle):
    """A stop cancels the reward's calls; the thread blocked reading the server must end now, not
    at the 30 s deadline, or the process waits for it at exit."""
    fn = remote(trickle.url, rm_timeout=30.0)

    async def cancel_soon():
        task = asyncio.ensure_future(fn(sample()))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(cancel_soon())
    started = time.monotonic()
    fn.executor.shutdown(wait=True)  # what interpreter exit does with the pool's threads
    assert time.monotonic() - started < 1.0


def test_an_aborted_deadline_ends_a_blocking_request_from_another_thread(trickle):
    deadline = Deadline(30.0)
    threading.Timer(0.3, deadline.abort).start()
    started = time.monotonic()
    with pytest.raises(RemoteAborted, match="cancelled"):
        post_json(trickle.url, {"x": 1}, timeout=30.0, deadline=deadline)
    assert time.monotonic() - started < 1.5
