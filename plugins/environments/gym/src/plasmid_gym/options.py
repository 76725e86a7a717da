"""The options of plasmid-gym, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.errors import UsageError
from plasmid.options import Options, option


class GymOptions(Options, group="gym", description="gym-style text environments (--datasource gym, --generate gym, "
                                                    "--reward gym)"):
    gym_env: str | None = option(None, "the environment: PACKAGE:ENV_ID, made with PACKAGE.make(ENV_ID) "
                                       "(textarena:GuessTheNumber-v0-train)", metavar="PACKAGE:ENV_ID")
    gym_players: int = option(1, "players per episode; each player's turns are a sample of their own, all in "
                                 "the episode's group", min=1)
    gym_gamma: float = option(1.0, "discount of the per-step rewards: a sample's reward is sum gamma^t r_t over "
                                   "its player's steps t = 0, 1, ... (1.0: their sum)", min=0.0, max=1.0)
    gym_max_turns: int = option(8, "at most this many model turns per episode (then it is TRUNCATED)", min=1)
    gym_size: int = option(10000, "training episodes (seeds) per epoch", min=1)
    gym_eval_size: int = option(16, "held-out eval episodes, seeded apart from the training ones", min=1)
    gym_seed: int | None = option(None, "seed of the episode seeds", min=0, default_text="--seed")

    def check(self) -> None:
        if self.gym_env is not None:
            package, _, env_id = self.gym_env.partition(":")
            if not package or not env_id:
                raise UsageError(f"--gym-env {self.gym_env!r}: give PACKAGE:ENV_ID (textarena:GuessTheNumber-v0)")
