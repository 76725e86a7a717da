"""Reward workers: event loops in daemon threads where reward calls run, so that a reward which
blocks its loop (``time.sleep`` in ``async def``, a CPU-bound verifier) can neither stall the
caller's loop nor keep its timeout from firing.

Used by :class:`plasmid.rewards.RewardSet` (the policy: which calls go where, timeouts, moving
the samples of a stuck worker); this module is the mechanism: a :class:`Mailbox` that hands
callables to a loop from any thread with one wake-up per batch, a :class:`Hop` that completes
when all the calls of one ``score_group`` have, and :class:`RewardWorker` threads kept per
reward component by :class:`Workers`, which also bounds how many stuck ones may live.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

#: A reward worker whose event loop has had calls but not run a callback for this long is abandoned.
STALL_SECONDS = 1.0
#: How often a reward worker's loop proves it is alive.
HEARTBEAT_SECONDS = 0.1
#: Abandoned workers of one reward that may still be alive (stuck) before no new ones are made.
MAX_ABANDONED_WORKERS = 32


class Pending:
    """The result slot of a call that has not returned (yet)."""


PENDING = Pending()


@dataclass
class Failure:
    """The result slot of a call that raised."""

    exc: BaseException


class Mailbox:
    """Callables handed to one event loop from any thread, with one wake-up per batch.

    ``call_soon_threadsafe`` per call costs a self-pipe write and a wake-up each; under load
    (many groups in flight) a mailbox coalesces them.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: collections.deque[Callable[[], None]] = collections.deque()
        self.scheduled = False

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the loop soon; :class:`RuntimeError` if the loop is closed."""
        self.items.append(fn)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        self.scheduled = False   # before draining: a post from now on schedules a new run
        items = self.items
        while items:
            items.popleft()()


class Hop:
    """The calls of one :meth:`RewardSet.score_group`: ``future`` is done when all of them are."""

    __slots__ = ("future", "remaining")

    def __init__(self, future: asyncio.Future[None], calls: int) -> None:
        self.future = future
        self.remaining = calls

    def finish_one(self) -> None:  # on the caller's loop
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(None)


class Call:
    """A coroutine to run on a worker's loop for a :class:`Hop` of the caller's."""

    __slots__ = ("coroutine", "hop", "reply", "worker", "task", "cancelled", "finished")

    def __init__(self, coroutine: Coroutine[Any, Any, None], hop: Hop, reply: Mailbox, worker: RewardWorker) -> None:
        self.coroutine = coroutine
        self.hop = hop
        self.reply = reply
        self.worker = worker
        self.finished = False
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False

    def start(self) -> None:  # on the worker's loop
        if self.cancelled:
            self.coroutine.close()
            return
        self.task = asyncio.get_running_loop().create_task(self.coroutine)
        self.task.add_done_callback(self._done)

    def _done(self, _task: asyncio.Task[None]) -> None:  # on the worker's loop
        try:
            self.reply.post(self._finish)
        except RuntimeError:  # the caller's loop is gone
            pass

    def _finish(self) -> None:  # on the caller's loop
        self.finished = True
        self.worker.outstanding -= 1
        self.hop.finish_one()

    def cancel_on_worker(self) -> None:  # on the worker's loop
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()


class RewardWorker:
    """A daemon thread running an event loop on which one reward's calls run.

    The loop schedules a heartbeat every :data:`HEARTBEAT_SECONDS`; :meth:`stalled` is true when
    it has calls to run but has not run for :data:`STALL_SECONDS` (something on the loop blocks it).

    :ivar outstanding: calls submitted and not yet finished (kept by the caller's thread).
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.inbox = Mailbox(self.loop)
        self.last_tick = time.monotonic()
        self.draining: asyncio.Task[None] | None = None
        self.outstanding = 0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            if tasks:
                self.loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()  # its default executor is shut down without waiting for stuck threads

    def _tick(self) -> None:
        self.last_tick = time.monotonic()
        self.loop.call_later(HEARTBEAT_SECONDS, self._tick)

    def stalled(self, now: float, after: float = STALL_SECONDS) -> bool:
        """Whether the loop has calls but has not run for ``after`` seconds."""
        return self.outstanding > 0 and now - self.last_tick > after

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def submit(self, coroutine: Coroutine[Any, Any, None], hop: Hop, reply: Mailbox) -> Call:
        """Run ``coroutine`` on this worker's loop; ``hop`` learns on ``reply``'s loop when it is done."""
        call = Call(coroutine, hop, reply, self)
        self.outstanding += 1
        self.inbox.post(call.start)
        return call

    def cancel(self, call: Call) -> None:
        """Cancel ``call`` on the worker's loop (once that loop runs again)."""
        call.cancelled = True
        try:
            self.inbox.post(call.cancel_on_worker)
        except RuntimeError:  # already closed
            pass

    def retire(self, grace: float) -> None:
        """Stop once the calls it has are done (at most ``grace`` seconds after it runs again)."""
        def drain() -> None:
            self.draining = self.loop.create_task(_drain_then_stop(grace))

        try:
            self.inbox.post(drain)
        except RuntimeError:  # already closed
            pass

    def stop(self) -> None:
        """Stop now: calls still running are cancelled once the loop runs again."""
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # already closed
            pass


async def _drain_then_stop(grace: float) -> None:
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    if others:
        await asyncio.wait(others, timeout=grace)
    asyncio.get_running_loop().stop()


class Workers:
    """The reward workers of a :class:`RewardSet`, one current worker per component.

    Kept apart from the set so that a finalizer can stop them when the set is dropped.
    """

    def __init__(self) -> None:
        self.current: dict[int, RewardWorker] = {}
        self.abandoned: dict[int, list[RewardWorker]] = {}
        self.abandoned_count = 0

    def get(self, position: int, name: str, grace: float) -> RewardWorker:
        worker = self.current.get(position)
        if worker is not None and not worker.alive:
            del self.current[position]
        elif worker is not None and worker.stalled(time.monotonic()):
            self.abandon(position, worker, grace)
        worker = self.current.get(position)
        if worker is None:
            worker = self.current[position] = RewardWorker(f"plasmid-reward-{name}")
        return worker

    def abandon(self, position: int, worker: RewardWorker, grace: float) -> bool:
        """Retire ``worker`` as stuck; whether it is no longer the component's current worker
        (false when :data:`MAX_ABANDONED_WORKERS` stuck ones are alive: no new thread is made)."""
        if self.current.get(position) is not worker:
            return True
        stuck = self.abandoned.setdefault(position, [])
        stuck[:] = [w for w in stuck if w.alive]
        if len(stuck) >= MAX_ABANDONED_WORKERS:
            return False  # no more threads for this reward: calls queue on the stuck worker and time out
        stuck.append(worker)
        worker.retire(grace)
        self.abandoned_count += 1
        del self.current[position]
        return True

    def stop(self) -> None:
        for worker in [*self.current.values(), *(w for ws in self.abandoned.values() for w in ws)]:
            worker.stop()
        self.current.clear()
        self.abandoned.clear()


def stop_workers(workers: Workers) -> None:
    workers.stop()
