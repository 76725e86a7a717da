"""Gathering concurrent calls into batches: up to ``size`` items, or whatever arrived within
``window`` seconds of the first, whichever comes first."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Batcher:
    """``await batcher.submit(item)`` -> the item's result from ``send(batch)``.

    ``send`` takes a list of items and returns one result per item, in order; if it raises, every
    item of that batch gets the exception. Bound to the event loop it is first used in.
    """

    def __init__(self, send: Callable[[list[Any]], Awaitable[list[Any]]], size: int, window: float) -> None:
        self.send = send
        self.size = max(1, size)
        self.window = window
        self.pending: list[tuple[Any, asyncio.Future]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task] = set()

    async def submit(self, item: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((item, future))
        if len(self.pending) >= self.size:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.window, self._flush)
        return await future

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        while self.pending:
            batch, self.pending = self.pending[: self.size], self.pending[self.size :]
            task = asyncio.ensure_future(self._deliver(batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _deliver(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        live = [(item, future) for item, future in batch if not future.done()]  # cancelled: skipped
        if not live:
            return
        try:
            results = await self.send([item for item, _ in live])
            if len(results) != len(live):
                raise ValueError(f"a batch of {len(live)} got {len(results)} results")
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the error
            for _, future in live:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(live, results, strict=True):
            if not future.done():
                future.set_result(result)
