"""Running a function where a provider lives, whichever runtime placed it.

A weight-sync plugin must do work on the trainer's side (export, send) and on each engine's side
(receive, load). ``await run_on(trainer, fn, *args)`` calls ``fn(trainer, *args)``: directly when
the trainer is a local object, inside its process when it is a proxy for a remote one (a Ray
actor). A proxy implements ``plasmid_call(fn, *args)``; ``fn`` must then be picklable (a
module-level function) and its arguments and result plain data.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


async def run_on(target: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(target, *args)``, run in ``target``'s process; awaited if it returns an awaitable."""
    remote_call = getattr(target, "plasmid_call", None)
    if remote_call is not None:
        return await remote_call(fn, *args)
    result = fn(target, *args)
    if inspect.isawaitable(result):
        result = await result
    return result


def is_remote(target: Any) -> bool:
    """Whether ``target`` is a proxy for a provider in another process."""
    return getattr(target, "plasmid_call", None) is not None
