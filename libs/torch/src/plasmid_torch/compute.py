"""One thread for the tensor work of every provider in a process.

Torch runs a CPU op on an OpenMP thread team that belongs to the calling thread. An engine and a
trainer that each compute on a thread of their own bring a team each, and on a small machine the
teams fight over the cores: on 2 cores the quickstart's train step took 57 ms with the engine's
team alive beside it, and 33 ms with both on one thread (rollout 34 ms -> 28 ms). So providers
that share a process (the local runtime: engine, trainer, reference model) submit their tensor
work to :func:`compute_executor`, one thread for the whole process. Their work is serialised; the
sync schedule runs it one after the other anyway, and where rollout and training should overlap
(``--schedule async``) a multi-process runtime (Ray) gives each provider a process of its own.

Contract for users of the thread: never wait on another job of this executor from inside a job
(it has one thread), and never shut it down (it lives as long as the process). Imports no torch.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def compute_executor() -> ThreadPoolExecutor:
    """This process's compute thread (created on first use)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plasmid-compute")
        return _executor


async def run_compute(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on the compute thread, awaited without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(compute_executor(), function, *args)
