"""The ``gym`` data source: one prompt per episode seed, its first observation as the prompt."""

from __future__ import annotations

import random
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.groups import GroupStream, make_group
from plasmid.kernel_options import GeneralOptions, PromptOptions, RolloutOptions
from plasmid.options import Options
from plasmid.prompt_limits import PromptLimit, PromptScreen
from plasmid.types import Group, PromptReport
from plasmid_gym import envs
from plasmid_gym.generate import render
from plasmid_gym.options import GymOptions
from plasmid_gym.recipe import prepare_tiny_model


class GymSource(GroupStream):
    """A :class:`plasmid.protocols.DataSource` of episodes of ``--gym-env``.

    Training serves ``--gym-size`` episode seeds endlessly (epoch ``e`` in a shuffle keyed by the
    seed and ``e``), eval ``--gym-eval-size`` seeds drawn apart from them. Each sample has
    ``prompt`` (the first observation as one user message), ``tokens`` (its chat-template
    rendering), ``label = {"env", "seed"}`` (what ``--generate gym`` replays) and ``metadata =
    {"seed"}``. The state is the stream's position (exact resume).

    First observations are measured against ``--max-prompt-length``
    (:class:`plasmid.prompt_limits.PromptScreen`): the eval episodes' at construction, training
    episodes' as they are drawn (resetting 10,000 episodes up front took about 50 s). An episode
    whose prompt is too long is skipped and counted (:attr:`prompt_report`: the eval episodes and
    the training ones drawn so far), or with ``--overlong-prompts error`` stops the run naming its
    seed; a split with nothing that fits is an error.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (GymOptions, GeneralOptions, RolloutOptions,
                                                           PromptOptions)

    @staticmethod
    def prepare(config: Config) -> None:
        """Build the tiny model the recipe named, if it is not there yet."""
        prepare_tiny_model(config)

    def __init__(self, config: Config) -> None:
        options, general = GymOptions.of(config), GeneralOptions.of(config)
        if options.gym_env is None:
            raise UsageError("--datasource gym needs --gym-env PACKAGE:ENV_ID")
        if general.model is None:
            raise UsageError("the gym data source needs --model (without it, plasmid train --datasource gym builds "
                             "a tiny one)")
        self.prepare(config)
        super().__init__(RolloutOptions.of(config).n_samples_per_prompt)
        self.spec, self.players = options.gym_env, options.gym_players
        seed = general.seed if options.gym_seed is None else options.gym_seed
        draw = random.Random(f"gym:{self.spec}:{seed}")
        seeds = draw.sample(range(2**31 - 1), options.gym_size + options.gym_eval_size)
        self.train, self.eval = seeds[:options.gym_size], seeds[options.gym_size:]
        self.key = f"{self.spec}:{seed}:{options.gym_size}:{options.gym_eval_size}"
        envs.make(self.spec)  # a bad --gym-env fails here, in one line
        from plasmid_torch.hf import load_tokenizer

        self.tokenizer = load_tokenizer(str(general.model))
        self.screen = PromptScreen(PromptLimit.of(config))
        self.eval = self.screen.kept(self.eval, self._measure, f"--gym-env {self.spec}'s eval episodes")
        self._order: tuple[int, list[int]] | None = None

    @property
    def prompt_report(self) -> PromptReport:
        """What the start-up screen found (:class:`~plasmid.protocols.SupportsPromptReport`)."""
        return self.screen.report(f"--gym-env {self.spec}")

    def _measure(self, seed: int) -> tuple[str, int]:
        """The episode of ``seed``: its location and prompt length in tokens."""
        return self._where(seed), len(self._item(seed)[1])

    def _where(self, seed: int) -> str:
        return f"--gym-env {self.spec} episode seed {seed}"

    def _item(self, seed: int) -> tuple[Any, list[int], dict[str, Any], dict[str, Any]]:
        env = envs.make(self.spec)
        envs.reset(env, self.players, seed)
        _, observation = envs.observe(env)
        prompt = [{"role": "user", "content": observation}]
        tokens = list(self.tokenizer.encode(render(self.tokenizer, prompt), add_special_tokens=False))
        return prompt, tokens, {"env": self.spec, "seed": seed}, {"seed": seed}

    def epoch_order(self, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            order = list(range(len(self.train)))
            random.Random(f"gym-epoch:{self.key}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def next_prompt(self) -> tuple[Any, list[int], Any, dict[str, Any]]:
        """The next training episode whose prompt fits (overlong ones skipped and counted)."""
        return self.screen.first_fitting(self._draw, lambda item: (self._where(item[2]["seed"]), len(item[1])),
                                         f"--gym-env {self.spec}'s training episodes", len(self.train))

    def _draw(self) -> tuple[Any, list[int], dict[str, Any], dict[str, Any]]:
        """The next training episode in epoch order, fitting or not."""
        if self.position == len(self.train):
            self.epoch, self.position = self.epoch + 1, 0
        k = self.epoch_order(self.epoch)[self.position]
        self.position += 1
        return self._item(self.train[k])

    def eval_groups(self) -> list[Group]:
        return [make_group(*self._item(seed), copies=1, first_sample_index=k, group_index=k)
                for k, seed in enumerate(self.eval)]

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.key, **self.stream_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("stream") != self.key:
            raise UsageError("the gym data source was saved for other episodes; resume with the same --gym-env, "
                             "--gym-seed, --gym-size and --gym-eval-size")
        self.load_stream_state(state)
