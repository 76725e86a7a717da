"""The ``reasoning-gym`` data source: prompt groups from a mixture of reasoning-gym datasets."""

from __future__ import annotations

import functools
import random
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.groups import GroupStream, make_group
from plasmid.kernel_options import GeneralOptions, PromptOptions, RolloutOptions
from plasmid.options import Options
from plasmid.prompt_limits import PromptLimit, PromptScreen
from plasmid.types import SUBSET_KEY, Group, PromptReport
from plasmid_reasoning_gym import gym
from plasmid_reasoning_gym.mixture import Split
from plasmid_reasoning_gym.options import ReasoningGymOptions
from plasmid_reasoning_gym.prompts import PromptEncoder, system_prompt
from plasmid_reasoning_gym.recipe import prepare_tiny_model, splits


class ReasoningGymSource(GroupStream):
    """A :class:`plasmid.protocols.DataSource` over the mixture of :mod:`plasmid_reasoning_gym.mixture`.

    Each sample has ``prompt`` (see :mod:`plasmid_reasoning_gym.prompts`), ``tokens`` (its ids
    under ``--model``'s tokenizer), ``label = {"dataset", "config", "index"}`` (what the
    ``reasoning-gym`` reward needs to rebuild the entry exactly: reasoning-gym entries hold
    tuples and other values JSON would change) and ``metadata = {"dataset": NAME, "subset": NAME, "answer":
    the entry's answer}``. Training walks the ``train`` split's ``--rg-size`` entries endlessly,
    epoch ``e`` in the order of a shuffle keyed by the split and ``e``; the eval split is the
    ``eval`` split's ``--rg-eval-size`` entries in order. The state is the stream's position, so
    a resumed source serves exactly the next prompts.

    Prompts are measured against ``--max-prompt-length``
    (:class:`plasmid.prompt_limits.PromptScreen`): the eval split's at construction, the training
    entries as they are drawn (generating 10,000 entries up front took 18 s). An entry whose
    prompt is too long is skipped and counted (:attr:`prompt_report`: the eval split and the
    training entries drawn so far), or with ``--overlong-prompts error`` stops the run naming it;
    a split with nothing that fits is an error.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (ReasoningGymOptions, GeneralOptions, RolloutOptions,
                                                           PromptOptions)

    @staticmethod
    def prepare(config: Config) -> None:
        """Build the tiny model the recipe named, if it is not there yet
        (:func:`plasmid_reasoning_gym.recipe.prepare_tiny_model`)."""
        prepare_tiny_model(config)

    def __init__(self, config: Config) -> None:
        gym.check_version()
        general = GeneralOptions.of(config)
        if general.model is None:
            raise UsageError("the reasoning-gym data source needs --model (without it, plasmid train builds a "
                             "tiny one: --datasource reasoning-gym)")
        self.prepare(config)  # a source built outside plasmid train still finds its model
        super().__init__(RolloutOptions.of(config).n_samples_per_prompt)
        self.train, self.eval = splits(config)
        self.encoder = PromptEncoder(general.model, system_prompt(ReasoningGymOptions.of(config).rg_system_prompt))
        self.screen = PromptScreen(PromptLimit.of(config))
        #: the eval split's entries whose prompt fits, in entry order
        self.eval_entries = self.screen.kept(range(self.eval.size), functools.partial(self._measure, self.eval),
                                             "the reasoning-gym eval split")
        self._order: tuple[int, list[int]] | None = None

    @property
    def prompt_report(self) -> PromptReport:
        """What the start-up screen found (:class:`~plasmid.protocols.SupportsPromptReport`)."""
        return self.screen.report("--datasource reasoning-gym")

    # ------------------------------------------------------------------------------- items
    def _where(self, split: Split, k: int) -> str:
        return f"reasoning-gym {split.split} entry {k} ({split.locate(k)[0]})"

    def _measure(self, split: Split, k: int) -> tuple[str, int]:
        """Entry ``k``'s location and prompt length in tokens."""
        return self._where(split, k), len(self._item(split, k)[1])

    def _item(self, split: Split, k: int) -> tuple[Any, list[int], dict[str, Any], dict[str, Any]]:
        entry = split.entry(k)
        prompt = self.encoder.prompt(str(entry["question"]))
        tokens = self.encoder.encode(prompt, self._where(split, k))
        label = split.label(k)
        answer = entry.get("answer")
        return prompt, tokens, label, {"dataset": label["dataset"], SUBSET_KEY: label["dataset"],
                                       "answer": answer if isinstance(answer, str) else None}

    def epoch_order(self, epoch: int) -> list[int]:
        """The training split's entries in the order epoch ``epoch`` visits them."""
        if self._order is None or self._order[0] != epoch:
            order = list(range(self.train.size))
            random.Random(f"rg-epoch:{self.train.key}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    # ------------------------------------------------------------------------------- training
    def next_prompt(self) -> tuple[Any, list[int], Any, dict[str, Any]]:
        """The next training entry whose prompt fits (overlong ones skipped and counted)."""
        drawn = self.screen.first_fitting(self._draw, lambda item: (self._where(self.train, item[0]), len(item[1][1])),
                                          "the reasoning-gym training split", self.train.size)
        return drawn[1]

    def _draw(self) -> tuple[int, tuple[Any, list[int], Any, dict[str, Any]]]:
        """The next training entry in epoch order, fitting or not: ``(its index, its item)``."""
        if self.position == self.train.size:
            self.epoch, self.position = self.epoch + 1, 0
        k = self.epoch_order(self.epoch)[self.position]
        self.position += 1
        return k, self._item(self.train, k)

    # ------------------------------------------------------------------------------- eval
    def eval_groups(self) -> list[Group]:
        """The eval split's entries that fit, one sample per group, numbered from 0."""
        return [make_group(*self._item(self.eval, k), copies=1, first_sample_index=position, group_index=position)
                for position, k in enumerate(self.eval_entries)]

    # ------------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.train.key, **self.stream_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("stream") != self.train.key:
            raise UsageError("the reasoning-gym data source was saved for other entries; resume with the same "
                             "--rg-dataset, --rg-config, --rg-size and --rg-seed (or --seed)")
        self.load_stream_state(state)
