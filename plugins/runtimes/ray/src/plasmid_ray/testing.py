"""Test support for code that runs under the Ray runtime: a local Ray cluster for a test module.

``local_cluster(cpus)`` starts Ray the way this machine's tests need it: its session directory
under a short path in /tmp (Ray's unix sockets live there and their paths must stay under ~107
characters), no usage stats, no uv runtime environments, no auth, and one math thread per actor.
A run started inside it (``plasmid.app.run.run_training``) uses this session and leaves it running.

Real hangs for deadline tests: :func:`hold_loads` / :func:`release_loads` (run in an engine's actor
through ``plasmid.remote.run_on``) block that engine's weight loads on an event of its process,
and :func:`stopped` freezes an actor's process (``SIGSTOP``) so that it answers nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Environment Ray reads when it starts (set for the cluster's lifetime, then restored).
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}


@contextmanager
def local_cluster(cpus: int) -> Iterator[Any]:
    """A local Ray cluster with ``cpus`` logical CPUs (actors reserve logical CPUs, so this may
    exceed the machine's cores); yields the ``ray`` module and shuts the cluster down after."""
    import ray

    from plasmid_ray.cluster import ACTOR_ENV

    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)
    temp_dir = tempfile.mkdtemp(prefix="plasmid-ray-", dir="/tmp")
    ray.init(num_cpus=cpus, include_dashboard=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": dict(ACTOR_ENV)}, log_to_driver=True)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ------------------------------------------------------------------------------ real hangs
#: The loads an engine may be asked to do (``RolloutEngine.update_weights``, a disk-loading engine's
#: ``load_weights_from_disk``): what :func:`hold_loads` blocks.
LOAD_METHODS = ("update_weights", "load_weights_from_disk")
#: Engines of this process whose loads are held: ``id(engine)`` -> (the event that lets them go,
#: the instance attributes the hold replaced, ``None`` where there was none).
_HELD: dict[int, tuple[threading.Event, dict[str, Any]]] = {}


def hold_loads(engine: Any) -> None:
    """(engine, in its own process) From now on every load of ``engine`` waits, before it starts,
    on an event of this process that only :func:`release_loads` sets: the engine is stuck in its
    load for real (the wait runs in a thread, so the actor still answers other calls, and a
    cancelled call leaves the thread waiting until the release). Holding a held engine is an error."""
    if id(engine) in _HELD:
        raise RuntimeError(f"the loads of {type(engine).__name__} in process {os.getpid()} are already held")
    gate = threading.Event()
    replaced: dict[str, Any] = {}
    for name in LOAD_METHODS:
        load = getattr(engine, name, None)
        if load is None:
            continue

        async def held(*args: Any, _load: Any = load, **kwargs: Any) -> Any:
            await asyncio.to_thread(gate.wait)
            return await _load(*args, **kwargs)

        replaced[name] = vars(engine).get(name)
        setattr(engine, name, held)
    _HELD[id(engine)] = (gate, replaced)


def release_loads(engine: Any) -> None:
    """(engine, in its own process) Undo :func:`hold_loads`: the engine loads normally again and
    the loads waiting on the event go on (those whose call was cancelled meanwhile end)."""
    gate, replaced = _HELD.pop(id(engine))
    for name, original in replaced.items():
        if original is None:
            delattr(engine, name)
        else:
            setattr(engine, name, original)
    gate.set()


def process_id(target: Any) -> int:
    """(any provider, in its own process) The id of the process it lives in."""
    return os.getpid()


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """Freeze process ``pid`` (``SIGSTOP``: every thread, Ray's own included, stops; the process
    answers nothing but stays alive) for the ``with`` block, then let it go on (``SIGCONT``)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
