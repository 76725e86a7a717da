"""The one place that talks to the environment package: ``make``, ``reset``, observations, ``step``.

The shape supported is TextArena's: ``PACKAGE.make(ENV_ID)``; ``env.reset(num_players=N, seed=S)``;
``env.get_observation() -> (player_id, text)``; ``env.step(action) -> (done, info)``;
``env.close() -> (rewards, info)`` with ``rewards`` a dict player -> reward (or ``None``) at the end.
A package exposing the same methods works the same way.
"""

from __future__ import annotations

import importlib
from typing import Any

from plasmid.errors import UsageError


def make(spec: str) -> Any:
    """A fresh environment of ``--gym-env PACKAGE:ENV_ID``; one-line :class:`UsageError` on failure."""
    package, _, env_id = spec.partition(":")
    try:
        module = importlib.import_module(package)
    except ModuleNotFoundError as exc:
        raise UsageError(f"--gym-env {spec}: no module {exc.name!r} (pip install {package})") from None
    maker = getattr(module, "make", None)
    if not callable(maker):
        raise UsageError(f"--gym-env {spec}: {package} has no make(ENV_ID)")
    try:
        return maker(env_id)
    except Exception as exc:  # noqa: BLE001 - the package's own failure, told in one line
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"--gym-env {spec}: {package}.make({env_id!r}) failed: {detail}") from None


def reset(env: Any, players: int, seed: int) -> None:
    env.reset(num_players=players, seed=seed)


def observe(env: Any) -> tuple[int, str]:
    player, observation = env.get_observation()
    return int(player), str(observation)


def step(env: Any, action: str) -> bool:
    """Play ``action`` for the current player; whether the episode is over."""
    result = env.step(action)
    done = result[0] if isinstance(result, tuple) else result
    return bool(done)


def final_rewards(env: Any, players: int) -> dict[int, float]:
    """The rewards ``close()`` gives each player (0.0 for a player it gives none, or when it gives none)."""
    closed = env.close()
    rewards = closed[0] if isinstance(closed, tuple) else closed
    rewards = rewards if isinstance(rewards, dict) else {}
    return {player: float(rewards.get(player, 0.0) or 0.0) for player in range(players)}


def new_text(previous: str, observation: str) -> str:
    """What ``observation`` adds: its text after ``previous`` when it extends it (TextArena repeats the
    whole history in each observation), else all of it."""
    if previous and observation.startswith(previous):
        return observation[len(previous):]
    return observation


def discounted(rewards: list[float], gamma: float) -> float:
    """``sum gamma^t r_t``."""
    return float(sum(reward * gamma**t for t, reward in enumerate(rewards)))
