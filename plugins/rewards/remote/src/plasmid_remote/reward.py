"""The ``remote`` reward: POST the sample to ``--rm-url``, read back a score.

Request body: ``{"prompt", "response", "label", "metadata"}`` (JSON; values JSON cannot hold
are sent as their text). Reply: a number, or an object of named numbers (choose one with
``--reward-key``; ``{"reward": 0.7}`` works without it). With ``--rm-batch-size N > 1``, calls
that arrive within ``--rm-batch-window`` seconds are sent together as a JSON list of request
bodies (at most N), and the reply must be a list of as many results, in order.

At most ``--rm-concurrency`` requests are in flight per event loop. Connection errors and 5xx
answers are retried up to ``--rm-retries`` times, after 1, 2, 4... times ``--rm-backoff``
seconds; 4xx answers, replies that are not JSON or not a score, and time-outs are not.
``--rm-timeout`` bounds each request whole (connecting, sending, the headers and the body), so a
server that trickles its answer cannot hold a call longer; a cancelled call (a stop,
``--reward-timeout``) ends its request at once, leaving no thread waiting on the server. With
``--rm-token-env NAME`` the value of environment variable NAME is sent as ``Authorization:
Bearer ...``; it never appears in logs or errors.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import numbers
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_remote.batching import Batcher
from plasmid_remote.options import RemoteOptions
from plasmid_remote.transport import Deadline, RemoteError, RetryableError, post_json, safe_url, scrub

log = logging.getLogger("plasmid_remote")


def check_score(value: Any, where: str) -> float | dict[str, float]:
    """``value`` if it is a number or a non-empty object of numbers; else :class:`RemoteError`."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict) and value and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    raise RemoteError(f"{where}: expected a number or an object of numbers, got {str(value)[:200]!r}")


class RemoteReward:
    """See the module docstring. Safe to call concurrently, from several event loops in turn."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (RemoteOptions,)

    def __init__(self, config: Config) -> None:
        options = RemoteOptions.of(config)
        if not options.rm_url:
            raise UsageError("reward 'remote' (plasmid-remote) needs --rm-url URL: where the reward model listens")
        self.url = options.rm_url
        self.timeout = options.rm_timeout
        self.retries = options.rm_retries
        self.backoff = options.rm_backoff
        self.concurrency = options.rm_concurrency
        self.batch_size = options.rm_batch_size
        self.batch_window = options.rm_batch_window
        self.token = None
        if options.rm_token_env:
            self.token = os.environ.get(options.rm_token_env)
            if not self.token:
                raise UsageError(f"--rm-token-env {options.rm_token_env}: that environment variable is not set "
                                 f"(or empty); export it, or drop --rm-token-env")
        self.executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="plasmid-remote")
        self._per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:  # never shows the token
        return f"RemoteReward(url={safe_url(self.url)!r}, batch_size={self.batch_size})"

    async def __call__(self, sample: Sample) -> float | dict[str, float]:
        body = {"prompt": sample.prompt, "response": sample.response, "label": sample.label,
                "metadata": sample.metadata}
        if self.batch_size > 1:
            return await self._loop_state()[1].submit(body)
        reply = await self._post(body)
        return check_score(reply, f"POST {safe_url(self.url)}")

    def _loop_state(self) -> tuple[asyncio.Semaphore, Batcher]:
        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            state = self._per_loop[loop] = (asyncio.Semaphore(self.concurrency),
                                            Batcher(self._send_batch, self.batch_size, self.batch_window))
        return state

    async def _send_batch(self, bodies: list[dict]) -> list[Any]:
        where = f"POST {safe_url(self.url)} (batch of {len(bodies)})"
        reply = await self._post(bodies)
        if not isinstance(reply, list) or len(reply) != len(bodies):
            raise RemoteError(f"{where}: expected a list of {len(bodies)} results, got {str(reply)[:200]!r}")
        return [check_score(value, where) for value in reply]

    async def _post(self, payload: Any) -> Any:
        """One request, retried on :class:`RetryableError` with exponential backoff."""
        semaphore = self._loop_state()[0]
        loop = asyncio.get_running_loop()
        for attempt in range(self.retries + 1):
            async with semaphore:
                deadline = Deadline(self.timeout)
                request = loop.run_in_executor(self.executor, functools.partial(
                    post_json, self.url, payload, timeout=self.timeout, token=self.token, deadline=deadline))
                try:
                    return await request
                except asyncio.CancelledError:
                    deadline.abort()  # the thread's blocking read ends now, not at the deadline
                    raise
                except RetryableError as exc:
                    if attempt == self.retries:
                        raise RetryableError(f"{exc} (gave up after {attempt + 1} attempts)") from None
                    delay = self.backoff * 2**attempt
                    log.warning("reward 'remote': %s; retrying in %.2fs (attempt %d of %d)",
                                scrub(str(exc), self.token), delay, attempt + 1, self.retries + 1)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")
