"""The one place that talks to the environment package: ``make``, ``reset``, observations, ``step``.

Two shapes are supported, told apart by whether the environment has ``get_observation``:

- TextArena's: ``PACKAGE.make(ENV_ID)``; ``env.reset(num_players=N, seed=S)``;
  ``env.get_observation() -> (player_id, text)``; ``env.step(action) -> (done, info)``;
  ``env.close() -> (rewards, info)`` with ``rewards`` a dict player -> reward (or ``None``) at the end.
- Gymnasium's, as GEM has it (one player): ``PACKAGE.make(ENV_ID)``; ``env.reset(seed=S) -> (obs, info)``;
  ``env.step(action) -> (obs, reward, terminated, truncated, info)``: each step's reward counts, and a
  truncated episode ends as truncated. :class:`GymnasiumEpisode` gives it TextArena's methods.

A package exposing either set of methods works the same way.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

from plasmid.errors import UsageError


class Step(NamedTuple):
    """What one action did: whether the episode is over, the acting player's reward for it, and
    whether the environment cut the episode short (gymnasium's ``truncated``)."""

    done: bool
    reward: float = 0.0
    truncated: bool = False


class GymnasiumEpisode:
    """A gymnasium-shaped environment (GEM's) seen through TextArena's methods: one player (0), the
    observation of the last ``reset``/``step``, each ``step``'s reward kept for :func:`step`."""

    def __init__(self, env: Any) -> None:
        self.env, self.observation, self.last = env, "", Step(False)

    def reset(self, num_players: int, seed: int) -> None:
        if num_players != 1:
            raise UsageError(f"--gym-players {num_players}: a gymnasium-shaped environment (reset/step with "
                             f"(obs, reward, terminated, truncated, info)) has one player")
        result = self.env.reset(seed=seed)
        self.observation = str(result[0] if isinstance(result, tuple) else result)

    def get_observation(self) -> tuple[int, str]:
        return 0, self.observation

    def step(self, action: str) -> Step:
        observation, reward, terminated, truncated, _ = self.env.step(action)
        self.observation = str(observation)
        self.last = Step(bool(terminated or truncated), float(reward), bool(truncated) and not bool(terminated))
        return self.last

    def close(self) -> tuple[dict[int, float], dict[str, Any]]:
        """No end-of-episode rewards: gymnasium's came with each step."""
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
        return {}, {}


def make(spec: str) -> Any:
    """A fresh environment of ``--gym-env PACKAGE:ENV_ID`` with TextArena's methods (a gymnasium-shaped
    one wrapped in :class:`GymnasiumEpisode`); one-line :class:`UsageError` on failure."""
    package, _, env_id = spec.partition(":")
    try:
        module = importlib.import_module(package)
    except ModuleNotFoundError as exc:
        raise UsageError(f"--gym-env {spec}: no module {exc.name!r} (pip install {package})") from None
    maker = getattr(module, "make", None)
    if not callable(maker):
        raise UsageError(f"--gym-env {spec}: {package} has no make(ENV_ID)")
    try:
        env = maker(env_id)
    except Exception as exc:  # noqa: BLE001 - the package's own failure, told in one line
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"--gym-env {spec}: {package}.make({env_id!r}) failed: {detail}") from None
    return env if hasattr(env, "get_observation") else GymnasiumEpisode(env)


def reset(env: Any, players: int, seed: int) -> None:
    env.reset(num_players=players, seed=seed)


def observe(env: Any) -> tuple[int, str]:
    player, observation = env.get_observation()
    return int(player), str(observation)


def step(env: Any, action: str) -> Step:
    """Play ``action`` for the current player (:class:`Step`: TextArena's steps score 0, its rewards
    come from ``close``)."""
    result = env.step(action)
    if isinstance(result, Step):
        return result
    done = result[0] if isinstance(result, tuple) else result
    return Step(bool(done))


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
