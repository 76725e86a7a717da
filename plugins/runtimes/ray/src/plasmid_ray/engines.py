"""Engine actors and their driver-side proxies, with restart after an actor dies.

:class:`EngineProxy` implements :class:`plasmid.protocols.RolloutEngine` over one
:class:`~plasmid_ray.actors.EngineHost` actor, plus ``plasmid_call`` for
:func:`plasmid.remote.run_on`. :class:`EnginePool` creates the actors in their bundles.

When a call finds its actor dead (``ray.exceptions.RayActorError``: killed, crashed, its node
lost), the proxy, once for all the callers that saw that death:

1. reports it on stderr, naming the engine, its actor and the error;
2. starts a new actor in the same bundle (at most ``--ray-engine-restarts`` times per engine);
3. re-syncs its weights from the trainer with the run's weight sync, at the newest version any
   engine serves (a fresh engine holds ``--model``, version 0); no other call reaches the new
   actor before that is done;
4. retries the calls that failed: ``generate`` restarts the request from its prompt with the same
   sampling seed. ``plasmid_call`` (a weight sync's step) and ``update_weights`` are not retried
   (half a sync cannot be resumed): they raise after the restart, and the runtime's
   :class:`~plasmid_ray.runtime.RestartSafeSync` runs the sync again.

In ``--schedule async`` the trainer may already hold the next step's weights when an engine is
re-synced; the restarted engine then serves them under the current version label (staleness is
over-stated by at most one step for its samples).
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from plasmid.config import Config
from plasmid.errors import PluginError, ProviderError
from plasmid.types import GenerationOutput, SamplingParams
from plasmid_ray.actors import EngineHost
from plasmid_ray.deaths import classify, oom_kills, oom_kills_since
from plasmid_ray.options import RayOptions
from plasmid_ray.placement import Placement

#: The proxy whose restart the current task is performing (its calls bypass the restart gate).
_RECOVERING: contextvars.ContextVar[Any] = contextvars.ContextVar("plasmid_ray_recovering", default=None)
#: Requests one engine actor accepts at once (it batches them itself).
ENGINE_MAX_CONCURRENCY = 4096


def report(message: str) -> None:
    """A runtime event for the person watching the run (stderr, like the loop's own lines)."""
    print(f"plasmid-ray: {message}", file=sys.stderr, flush=True)


def creation_error(exc: BaseException) -> str:
    """The root cause of an actor's failure to start, from Ray's error text (its last
    ``SomeError: message`` line), or the whole text."""
    text = str(exc)
    causes = [line.strip() for line in text.splitlines() if re.match(r"^\s*[\w.]+(Error|Exception): ", line)]
    return causes[-1] if causes else text


async def wait_ready(actor: Any, what: str) -> dict[str, Any]:
    """Await an actor's ``ready()``; a failed start is a :class:`PluginError` (plugin lock,
    imports) or :class:`ProviderError` naming ``what`` and the cause."""
    import ray

    try:
        return await actor.ready.remote()
    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
        cause = creation_error(exc)
        error = PluginError if "PluginError" in cause else ProviderError
        raise error(f"{what} failed to start: {cause}") from exc


class _LoopState:
    """An ``asyncio.Lock`` and an "available" ``Event`` for each event loop that uses the proxy
    (``plasmid.testing.run`` makes a new loop per call)."""

    def __init__(self) -> None:
        self._by_loop: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Lock, asyncio.Event]] = {}

    def get(self) -> tuple[asyncio.Lock, asyncio.Event]:
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(id(loop))
        if found is None or found[0] is not loop:
            available = asyncio.Event()
            available.set()
            found = (loop, asyncio.Lock(), available)
            self._by_loop = {k: v for k, v in self._by_loop.items() if not v[0].is_closed()}
            self._by_loop[id(loop)] = found
        return found[1], found[2]


class EngineProxy:
    """:class:`plasmid.protocols.RolloutEngine` for the engine in actor ``index`` of ``pool``.

    :ivar in_flight: ``generate`` calls awaiting an answer (the load balancer reads it).
    :ivar restarts: how many times this engine's actor was replaced.
    """

    def __init__(self, pool: EnginePool, index: int, actor: Any, info: dict[str, Any]) -> None:
        self.pool, self.index, self.actor, self.info = pool, index, actor, info
        self.incarnation = 0
        self.in_flight = 0
        self.requests = 0
        self.restarts = 0
        self._weight_version = int(info.get("weight_version", 0))
        self._state = _LoopState()

    def __repr__(self) -> str:
        return f"EngineProxy(engine {self.index}, actor {self.actor_id})"

    @property
    def actor_id(self) -> str:
        try:
            return self.actor._actor_id.hex()[:12]
        except AttributeError:
            return "?"

    # ------------------------------------------------------------------------ RolloutEngine
    @property
    def weight_version(self) -> int:
        """The version the actor reported after its last weight update (cached: a property
        cannot wait on the actor)."""
        return self._weight_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        self.in_flight += 1
        self.requests += 1
        try:
            return await self._call("generate", list(prompt_ids), params)
        finally:
            self.in_flight -= 1

    async def response_logprobs(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        return await self._call("response_logprobs", list(token_ids), prompt_length, temperature)

    #: the deprecated name of :meth:`response_logprobs` (see :class:`plasmid.protocols.RolloutEngine`)
    score = response_logprobs

    async def abort_all(self) -> int:
        import ray

        try:
            return await self._call("abort_all", retry=False)
        except ProviderError as exc:
            if isinstance(exc.__cause__, ray.exceptions.RayActorError):
                return 0  # its requests died with it; their callers retry on the new actor
            raise

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], weight_version: int) -> None:
        self._weight_version = await self._call("update_weights", list(named_tensors), weight_version, retry=False)

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        return await self._call("get_weights", list(names))

    async def flush_cache(self) -> None:
        await self._call("flush_cache")

    async def release_memory(self) -> None:
        await self._call("release_memory")

    async def resume_memory(self) -> None:
        await self._call("resume_memory")

    async def shutdown(self) -> None:
        """Shut the engine down and end its actor (errors of a dead actor are ignored)."""
        import ray

        try:
            await self.actor.shutdown.remote()
        except ray.exceptions.RayError:
            pass
        ray.kill(self.actor, no_restart=True)

    async def plasmid_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(engine, *args)`` inside the actor (see :func:`plasmid.remote.run_on`)."""
        result, self._weight_version = await self._call("call", fn, args, retry=False)
        return result

    # ------------------------------------------------------------------------ calls and restarts
    async def _call(self, method: str, *args: Any, retry: bool = True) -> Any:
        import ray

        restarting_me = _RECOVERING.get() is self
        while True:
            if not restarting_me:
                await self._state.get()[1].wait()
            actor, incarnation = self.actor, self.incarnation
            ref = getattr(actor, method).remote(*args)
            try:
                return await ref
            except asyncio.CancelledError:
                ray.cancel(ref)
                raise
            except ray.exceptions.RayActorError as exc:
                if restarting_me:
                    raise ProviderError(f"engine {self.index} died again while it was being restarted: "
                                        f"{self.pool.death_cause(exc)}", provider="ray") from exc
                await self._recover(incarnation, method, exc)
                if not retry:
                    raise ProviderError(f"engine {self.index} died during {method}; it was restarted and re-synced, "
                                        f"but {method} is not retried", provider="ray") from exc

    async def _recover(self, incarnation: int, method: str, error: BaseException) -> None:
        """Replace a dead actor (once per death, whoever notices it first) and re-sync it."""
        lock, available = self._state.get()
        async with lock:
            if self.incarnation != incarnation:
                return
            if self.restarts >= self.pool.max_restarts:
                pid = self.info.get("pid", "?")
                raise ProviderError(f"engine {self.index} (actor {self.actor_id}, pid {pid}) died "
                                    f"during {method} and has been restarted {self.restarts} times already "
                                    f"(--ray-engine-restarts {self.pool.max_restarts}): "
                                    f"{self.pool.death_cause(error)}", provider="ray") from error
            available.clear()
            try:
                await self._restart(method, error)
            finally:
                available.set()

    async def _restart(self, method: str, error: BaseException) -> None:
        import ray

        version = self.pool.current_version()
        bundle = self.pool.placement.engine_bundles[self.index]
        report(f"engine {self.index} (actor {self.actor_id}, pid {self.info.get('pid', '?')}) died during {method}: "
               f"{self.pool.death_cause(error)}; "
               f"restarting it in bundle {bundle} (restart {self.restarts + 1} of at most {self.pool.max_restarts})")
        ray.kill(self.actor, no_restart=True)
        self.actor = self.pool.spawn(self.index)
        self.info = await wait_ready(self.actor, f"engine {self.index} (restart)")
        self.incarnation += 1
        self.restarts += 1
        self._weight_version = int(self.info.get("weight_version", 0))
        if version > self._weight_version and self.pool.resync is not None:
            token = _RECOVERING.set(self)
            try:
                await self.pool.resync(self, version)
            finally:
                _RECOVERING.reset(token)
        report(f"engine {self.index} restarted as actor {self.actor_id} (pid {self.info.get('pid')}), serving weight "
               f"version {self._weight_version}; retrying its requests")


class EnginePool:
    """The run's engine actors: one per ``--engines``, each in its bundle of ``placement``.

    :ivar resync: ``async (proxy, version)`` that brings a restarted engine to ``version``
        (the runtime sets it to a one-engine weight sync from the trainer).
    """

    def __init__(self, config: Config, placement: Placement) -> None:
        self.config, self.placement = config, placement
        self.max_restarts = RayOptions.of(config).ray_engine_restarts
        self.proxies: list[EngineProxy] = []
        self.resync: Callable[[EngineProxy, int], Awaitable[Any]] | None = None
        #: the kernel's OOM kill count when the pool was made (see :func:`plasmid_ray.deaths.classify`)
        self.oom_base = oom_kills()

    def death_cause(self, exc: BaseException) -> str:
        """One line saying why an engine actor died (:func:`plasmid_ray.deaths.classify`)."""
        return classify(exc, oom_kills_since(self.oom_base)).cause

    def spawn(self, index: int) -> Any:
        """Create engine actor ``index`` in its bundle (not waited for)."""
        import ray

        resources = self.placement.engine
        options = {**resources.as_options(), **self.placement.scheduling(self.placement.engine_bundles[index]),
                   "max_concurrency": ENGINE_MAX_CONCURRENCY, "max_restarts": 0}
        return ray.remote(EngineHost).options(**options).remote(self.config, index, resources.cpus)

    async def start(self) -> list[EngineProxy]:
        """Create every engine actor and wait until each has built its engine (see :meth:`_start_one`)."""
        actors: list[Any] = [None] * len(self.placement.engine_bundles)
        try:
            infos = await asyncio.gather(*(self._start_one(index, actors) for index in range(len(actors))))
        except BaseException:
            self.kill(actor for actor in actors if actor is not None)
            raise
        self.proxies = [EngineProxy(self, index, actor, info) for index, (actor, info) in
                        enumerate(zip(actors, infos, strict=True))]
        return list(self.proxies)

    async def _start_one(self, index: int, actors: list[Any]) -> dict[str, Any]:
        """Start engine ``index`` (its actor is kept in ``actors[index]``); its ``ready()`` info.

        An actor whose process died while starting (killed, out of memory: not an exception in
        its constructor, which would only fail again) is started again in its bundle, at most
        ``--ray-engine-restarts`` times, like an engine that dies while serving."""
        import ray

        for attempt in range(self.max_restarts + 1):
            actors[index] = self.spawn(index)
            try:
                return await wait_ready(actors[index], f"engine {index}")
            except ProviderError as error:
                died = error.__cause__
                if (not isinstance(died, ray.exceptions.RayActorError) or died.actor_init_failed
                        or attempt == self.max_restarts):
                    raise
                report(f"engine {index} died while starting ({self.death_cause(died)}); starting it again in its "
                       f"bundle (restart {attempt + 1} of at most {self.max_restarts})")
        raise AssertionError("unreachable")

    def current_version(self) -> int:
        """The newest weight version any engine serves (what a restarted engine is synced to)."""
        return max((proxy.weight_version for proxy in self.proxies), default=0)

    @staticmethod
    def kill(actors: Iterable[Any]) -> None:
        import ray

        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
