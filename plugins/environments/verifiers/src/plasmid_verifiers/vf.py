"""The one place that talks to the verifiers package: its version, loading environments, scoring.

:func:`check_version` is the start-up check (the plugin's ``plasmid_configure`` runs it when the
data source or the reward is chosen; the providers run it when built): a missing or unsupported
verifiers, or openai, is one :class:`~plasmid.errors.UsageError` line with the pip command. verifiers changes
its API between minor versions, so only the tested range is accepted. The classic (v0) API is
used: ``verifiers.load_environment``, ``Environment.get_dataset``, ``Environment.rollout``,
``Environment.init_state`` and ``Rubric.score_rollout``; a module that is a verifiers v1 taskset is
loaded by :mod:`plasmid_verifiers.v1`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from packaging.specifiers import SpecifierSet

from plasmid.errors import UsageError
from plasmid_torch import versions

#: The verifiers releases this adapter is tested with, as pyproject.toml declares them (test_vf_options checks).
SUPPORTED = SpecifierSet(">=0.3.1,<0.3.2")
DISTRIBUTION = "verifiers"
#: The openai releases it is tested with beside verifiers 0.3.1 (whose openai-agents needs openai>=3): the
#: gateway's client (``AsyncOpenAI``), checked at start-up with verifiers, declared alike in pyproject.toml.
OPENAI_SUPPORTED = SpecifierSet(">=3.57,<4")
#: A client for :meth:`Environment.init_state` when no model is called (scoring a given response).
UNUSED_URL = "http://127.0.0.1:9/v1"


def installed_version() -> str | None:
    """The installed verifiers version (its metadata), or ``None`` when it is not installed."""
    return versions.installed_version(DISTRIBUTION)


def check_version() -> str:
    """The installed verifiers version when it and the installed openai are supported; else a one-line
    :class:`UsageError` (verifiers' first)."""
    version = versions.check_supported(DISTRIBUTION, installed_version(), SUPPORTED, "plasmid-verifiers")
    versions.check_supported("openai", versions.installed_version("openai"), OPENAI_SUPPORTED, "plasmid-verifiers")
    return version


def parse_env_args(text: str) -> dict[str, Any]:
    """``--vf-env-args``: a JSON object, else a one-line :class:`UsageError`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--vf-env-args {text!r}: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise UsageError(f"--vf-env-args {text!r}: give a JSON object of load_environment's keyword arguments")
    return value


def canonical_args(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True)


@functools.lru_cache(maxsize=16)
def load_env(name: str, args_json: str = "{}") -> Any:
    """The environment ``verifiers.load_environment(name, **args)``, or, when module ``name`` is a
    verifiers v1 taskset (:func:`plasmid_verifiers.v1.is_taskset`), that taskset
    (:func:`plasmid_verifiers.v1.load`, ``args`` its config); one per name and arguments per process.
    Anything that goes wrong is one :class:`UsageError` naming ``--vf-env`` (a v1 taskset with a
    verifiers that offers no v1 tasksets included)."""
    check_version()
    args = parse_env_args(args_json)
    import verifiers

    from plasmid_verifiers import v1

    if v1.is_taskset(name):
        return v1.load(name, args)
    try:
        env = verifiers.load_environment(name, **args)
    except Exception as exc:  # noqa: BLE001 - the environment's own failure, told in one line
        cause = exc.__cause__ or exc
        detail = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise UsageError(f"--vf-env {name}: verifiers could not load it ({type(cause).__name__}: {detail}); is "
                         f"its package installed (pip install it), and --vf-env-args right?") from None
    check_scorable(env, name)
    return env


def is_v1(env: Any) -> bool:
    """Whether ``env`` (from :func:`load_env`) is a verifiers v1 taskset (:class:`plasmid_verifiers.v1.V1Taskset`)."""
    from plasmid_verifiers.v1 import V1Taskset

    return isinstance(env, V1Taskset)


def check_scorable(env: Any, name: str) -> None:
    """Refuse, in one :class:`UsageError` line, an environment this adapter cannot score: not a
    classic (v0) ``verifiers.Environment``, or a rubric with group-level reward functions (those
    whose parameters are plural, ``states``/``completions``/..., or that return a list). Each
    rollout is scored alone, by ``Rubric.score_rollout``, which verifiers itself refuses for such a
    rubric (an ``AssertionError``); they need verifiers' ``score_group`` over a whole group."""
    from verifiers.legacy.envs.environment import Environment

    if not isinstance(env, Environment):
        raise UsageError(f"--vf-env {name}: load_environment returned a {type(env).__module__}."
                         f"{type(env).__qualname__}, not a classic (v0) verifiers.Environment; v1 environments are "
                         f"not supported")
    rubric = env.rubric
    group = [getattr(func, "__name__", repr(func)) for func in rubric._get_reward_funcs()
             if rubric._is_group_func(func)]
    if group:
        raise UsageError(f"--vf-env {name}: its rubric has group-level reward functions ({', '.join(group)}), "
                         f"which verifiers scores only over a whole group (Rubric.score_group); plasmid-verifiers "
                         f"scores each rollout alone (Rubric.score_rollout): make them per-rollout functions")


def plain(value: Any) -> Any:
    """``value`` as JSON data (dataset rows hold only such values; anything else becomes its text)."""
    return json.loads(json.dumps(value, default=str))


def dataset_rows(env: Any, split: str, seed: int | None = None) -> list[dict[str, Any]]:
    """The rows of the environment's ``train`` or ``eval`` dataset as plain dicts (``eval``, as
    verifiers' ``get_eval_dataset`` has it: the training dataset when the environment has no eval
    dataset). A v1 taskset's rows are its tasks (the same for both splits)."""
    if is_v1(env):
        return env.rows()
    if split == "eval":
        dataset = env.get_eval_dataset()
    else:
        dataset = env.get_dataset(seed=seed)
    return [plain(dict(row)) for row in dataset]


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The environment's tools as OpenAI function specs (what a chat template's ``tools=`` takes); none
    for a v1 taskset, whose tools are MCP servers started for each rollout."""
    if is_v1(env):
        return []
    return [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                              "parameters": tool.parameters}} for tool in env.tool_defs or []]


def reward_names(env: Any) -> list[str]:
    """The names of the rubric's functions (the keys of :func:`score_completion`'s metrics)."""
    return list(env.rubric._get_reward_func_names())


async def score_state(env: Any, state: Any) -> tuple[float, dict[str, float]]:
    """``(reward, metrics)`` of a finished rollout state: verifiers' ``rubric.score_rollout``
    (the weighted sum of the rubric's functions, and each function's score)."""
    await env.rubric.score_rollout(state)
    return float(state["reward"]), {str(k): float(v) for k, v in (state["metrics"] or {}).items()}


@functools.lru_cache(maxsize=1)
def unused_client() -> Any:
    """The client :meth:`Environment.init_state` is given when no model is called (never used for
    a request); made once, with the imports it needs (a reward calls :func:`warm` when built, so
    that its first score does not stall its worker's event loop on imports)."""
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    return OpenAIChatCompletionsClient(AsyncOpenAI(base_url=UNUSED_URL, api_key="unused", max_retries=0))


def warm() -> None:
    """Import what scoring needs now (not on a reward worker's loop)."""
    import verifiers.utils.message_utils  # noqa: F401

    unused_client()


async def score_completion(env: Any, row: dict[str, Any],
                           completion: list[dict[str, Any]]) -> tuple[float, dict[str, float]]:
    """``(reward, metrics)`` of ``completion`` (chat messages) as the answer to dataset row ``row``:
    the state verifiers itself builds for the row (``init_state``), with that completion and no
    trajectory, scored by the rubric."""
    from verifiers.utils.message_utils import normalize_messages

    state = await env.init_state(row, unused_client(), "plasmid")
    state["completion"] = normalize_messages(completion, field_name="completion")
    return await score_state(env, state)
