"""verifiers v1 tasksets: loading one, its tasks as dataset rows, and one rollout of a task.

A v1 taskset (``verifiers.v1.Taskset``: a module exporting one ``Taskset`` subclass in ``__all__``,
whose ``load()`` yields ``Task`` objects; rewards and metrics are the task's ``@vf.reward`` and
``@vf.metric`` methods) is run as verifiers runs it: its environment, verifiers' ``SingleAgentEnv`` (a
taskset whose package exports an ``Env`` of its own, several agents say, is refused), is built by
``verifiers.v1.load_environment``, and each rollout
is ``Env.run_episode`` of one task, whose agent is :mod:`plasmid_verifiers_harness` (a chat loop in
this process) in a subprocess runtime, with verifiers' model client pointed at the session's
plasmid-agent gateway (so the engine answers, and the gateway records the exact tokens). The
episode's trace is scored by verifiers (``Task.score``): the reward is ``trace.reward``, the sum of
the weighted rewards; each reward's score and each metric is a part.

A verifiers without the v1 API (no ``verifiers.v1`` module, or one missing what is used here) is
refused in one line: "verifiers <version> offers no v1 tasksets".
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from plasmid.errors import UsageError

#: The id verifiers resolves this adapter's harness by (the top-level module exporting it).
HARNESS_ID = "plasmid_verifiers_harness"
#: The environment variable verifiers' client reads its API key from (the gateway needs none: the
#: session's key is part of its base URL).
API_KEY_VAR = "PLASMID_VERIFIERS_V1_API_KEY"
#: What of verifiers.v1 this module uses (a verifiers that lacks one offers no v1 tasksets here).
REQUIRED = ("Taskset", "Harness", "ModelContext", "EvalClientConfig", "SingleAgentEnv", "environment_class",
            "load_environment", "resolve_env_config")


def check_offered(name: str | None = None) -> None:
    """Return when the installed verifiers offers v1 tasksets; else a one-line :class:`UsageError`
    (naming ``--vf-env name`` when given)."""
    try:
        import verifiers.v1 as vf1
    except ImportError:
        missing: list[str] = ["verifiers.v1"]
    else:
        missing = [name for name in REQUIRED if not hasattr(vf1, name)]
    if missing:
        from plasmid_verifiers.vf import installed_version

        where = f"--vf-env {name} is a verifiers v1 taskset, but " if name else ""
        raise UsageError(f"{where}verifiers {installed_version()} offers no v1 tasksets (it lacks "
                         f"{', '.join(missing)}); install a verifiers with the v1 API (pip install "
                         f"'verifiers>=0.3.1,<0.3.2')")


def is_taskset(name: str) -> bool:
    """Whether ``name`` is a v1 taskset: the module verifiers' v1 loader resolves for it exports one
    ``Taskset`` subclass in ``__all__`` and no classic ``load_environment`` (and no installed module
    ``name`` has one: the classic environment comes first, as before v1). A module that
    needs ``verifiers.v1`` while the installed verifiers has none is a v1 taskset this verifiers
    cannot load: a one-line :class:`UsageError` (:func:`check_offered`)."""
    import importlib

    try:
        from verifiers.v1.utils.loaders import import_taskset, taskset_class
    except ImportError:
        try:
            importlib.import_module(name.replace("-", "_"))
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("verifiers.v1"):
                check_offered(name)
        except Exception:  # noqa: BLE001 - not importable: not a v1 taskset this can tell
            return False
        return False
    try:
        if hasattr(importlib.import_module(name.replace("-", "_")), "load_environment"):
            return False   # a classic environment, even where verifiers ships a v1 taskset of that name
    except Exception:  # noqa: BLE001 - verifiers' v1 loader may still resolve it (a hub id, a built-in)
        pass
    try:
        taskset_class(name)
    except Exception:  # noqa: BLE001 - not a v1 taskset, whatever the reason
        return False
    return not hasattr(import_taskset(name), "load_environment")


@dataclass
class Serving:
    """verifiers' serving resources of one environment (``Env.serving()``: its interception server
    and shared tool servers) on one event loop, held while any rollout on that loop runs: the first
    rollout starts them in a task of their own, the last one to finish stops them."""

    env: Any
    users: int = 0
    loop: asyncio.AbstractEventLoop | None = None
    ready: asyncio.Event | None = None
    done: asyncio.Event | None = None
    holder: asyncio.Task | None = None
    failure: BaseException | None = None

    @contextlib.asynccontextmanager
    async def held(self):
        loop = asyncio.get_running_loop()
        if self.loop is not loop:   # a new loop (the old one's tasks died with it)
            self.loop, self.users, self.holder, self.failure = loop, 0, None, None
        self.users += 1
        try:
            if self.holder is None:
                self.ready, self.done, self.failure = asyncio.Event(), asyncio.Event(), None
                self.holder = loop.create_task(self._hold(self.ready, self.done))
            assert self.ready is not None
            await self.ready.wait()
            if self.failure is not None:
                raise RuntimeError(f"verifiers could not start the environment's serving resources "
                                   f"({type(self.failure).__name__}: {self.failure})")
            yield
        finally:
            self.users -= 1
            if self.users == 0 and self.holder is not None:
                holder, self.holder = self.holder, None
                assert self.done is not None
                self.done.set()
                await holder

    async def _hold(self, ready: asyncio.Event, done: asyncio.Event) -> None:
        try:
            async with self.env.serving():
                ready.set()
                await done.wait()
        except Exception as exc:  # noqa: BLE001 - told to every waiting rollout
            self.failure = exc
        finally:
            ready.set()


@dataclass
class V1Taskset:
    """A loaded v1 taskset: its verifiers environment and its tasks, in ``load()`` order (each a row:
    ``{"prompt": chat messages, "task": position, "example_id": position}``)."""

    name: str
    env: Any
    tasks: list[Any]
    serving: Serving = field(init=False)

    def __post_init__(self) -> None:
        self.serving = Serving(self.env)

    def rows(self) -> list[dict[str, Any]]:
        return [{"prompt": prompt_messages(task.data), "task": k, "example_id": k} for k, task in enumerate(self.tasks)]

    async def rollout(self, index: int, base_url: str, model: str) -> tuple[float, dict[str, float]]:
        """``(reward, parts)`` of one episode of task ``index`` whose model calls go to ``base_url``
        (an OpenAI base URL) as ``model``; an episode verifiers ends with an error raises, naming it."""
        import verifiers.v1 as vf1

        task = self.tasks[index]
        ctx = vf1.ModelContext(model=model, client=vf1.EvalClientConfig(base_url=base_url, api_key_var=API_KEY_VAR))
        async with self.serving.held():
            episode = await self.env.run_episode(task, ctx)
        errors = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
        if not episode.ok or errors:
            detail = f"{errors[-1].type}: {errors[-1].message.splitlines()[0]}" if errors else "no trace succeeded"
            raise RuntimeError(f"verifiers v1 taskset {self.name} task {index} failed ({detail})")
        trace = episode.traces[-1]
        parts = {name: float(reward.score) for name, reward in trace.rewards.items() if reward is not None}
        parts.update({name: float(value) for name, value in trace.metrics.items() if value is not None})
        return float(trace.reward), parts


def prompt_messages(data: Any) -> list[dict[str, Any]]:
    """A task's opening as chat messages: its system prompt, then its prompt (text as one user message)."""
    from verifiers.v1.dialects.chat import message_to_wire

    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    elif data.prompt is not None:
        messages.extend(message_to_wire(message) for message in data.prompt)
    return messages


def load(name: str, args: dict[str, Any]) -> V1Taskset:
    """The v1 taskset ``name`` with its taskset config ``args`` (``--vf-env-args``: fields of its
    ``TasksetConfig``), run with this adapter's harness in a subprocess runtime; a bad config, a
    taskset with no task or an endless one, or one with its own ``Env``, is a one-line
    :class:`UsageError` naming ``--vf-env``."""
    check_offered(name)
    import verifiers.v1 as vf1

    env_class = vf1.environment_class(name)
    if env_class is not vf1.SingleAgentEnv:
        raise UsageError(f"--vf-env {name}: the v1 taskset's package exports its own environment "
                         f"({env_class.__module__}.{env_class.__qualname__}); plasmid-verifiers runs v1 tasksets in "
                         f"verifiers' SingleAgentEnv (one agent: the policy)")
    try:
        config = vf1.resolve_env_config({"taskset": {**args, "id": name},
                                         "agent": {"harness": {"id": HARNESS_ID}, "runtime": {"type": "subprocess"}}})
        env = vf1.load_environment(config)
    except Exception as exc:  # noqa: BLE001 - verifiers' own failure, told in one line
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"--vf-env {name}: verifiers could not load this v1 taskset ({type(exc).__name__}: "
                         f"{detail}); is --vf-env-args a valid config of its TasksetConfig?") from None
    if env.taskset.INFINITE:
        raise UsageError(f"--vf-env {name}: the v1 taskset is infinite; plasmid-verifiers needs a finite one")
    tasks = list(env.taskset)
    if not tasks:
        raise UsageError(f"--vf-env {name}: the v1 taskset yields no task")
    return V1Taskset(name, env, tasks)
