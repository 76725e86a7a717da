"""The ``verifiers`` data source: prompt groups from the environment's dataset."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.groups import GroupStream, make_group
from plasmid.kernel_options import GeneralOptions, PromptOptions, RolloutOptions
from plasmid.options import Options
from plasmid.prompt_limits import PromptLimit, PromptScreen
from plasmid.types import Group, PromptReport
from plasmid_verifiers import vf
from plasmid_verifiers.options import VerifiersOptions
from plasmid_verifiers.recipe import prepare_tiny_model


class VerifiersSource(GroupStream):
    """A :class:`plasmid.protocols.DataSource` over ``--vf-env``'s dataset.

    Each sample has ``prompt`` (the row's chat messages), ``tokens`` (their rendering with
    ``--model``'s chat template and the environment's tools, generation prompt added),
    ``label = {"env", "env_args", "row"}`` (what the rollout and the reward need: the whole row,
    as JSON data) and ``metadata = {"example_id": ...}``. Training walks the dataset endlessly,
    epoch ``e`` in the order of a shuffle keyed by ``--vf-seed`` (or ``--seed``) and ``e``; the
    eval split is the environment's eval dataset, in order (verifiers' own fallback: the training
    dataset when it has none). The state is
    the stream's position, so a resumed source serves exactly the next prompts.

    At construction every row of both datasets is rendered and measured against
    ``--max-prompt-length`` (:class:`plasmid.prompt_limits.PromptScreen`): a row whose prompt is
    too long is left out and counted (:attr:`prompt_report`), or with ``--overlong-prompts error``
    stops the run naming it; a dataset left empty is an error.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (VerifiersOptions, GeneralOptions, RolloutOptions,
                                                           PromptOptions)

    @staticmethod
    def prepare(config: Config) -> None:
        """Build the tiny model the recipe named, if it is not there yet."""
        prepare_tiny_model(config)

    def __init__(self, config: Config) -> None:
        vf.check_version()
        options, general = VerifiersOptions.of(config), GeneralOptions.of(config)
        if options.vf_env is None:
            raise UsageError("--datasource verifiers needs --vf-env NAME: an installed verifiers environment")
        if general.model is None:
            raise UsageError("the verifiers data source needs --model (without it, plasmid train builds a tiny one)")
        self.prepare(config)
        super().__init__(RolloutOptions.of(config).n_samples_per_prompt)
        self.name, self.args = options.vf_env, vf.parse_env_args(options.vf_env_args)
        self.env = vf.load_env(self.name, vf.canonical_args(self.args))
        self.seed = general.seed if options.vf_seed is None else options.vf_seed
        self.train = vf.dataset_rows(self.env, "train")
        self.eval = vf.dataset_rows(self.env, "eval")
        if not self.train:
            raise UsageError(f"--vf-env {self.name}: its training dataset is empty")
        self.key = f"{self.name}:{vf.canonical_args(self.args)}:{len(self.train)}:{self.seed}"
        from plasmid_torch.hf import load_tokenizer

        self.model = str(general.model)
        self.tokenizer = load_tokenizer(self.model)
        self.tools = vf.tool_schemas(self.env)
        self.screen = PromptScreen(PromptLimit.of(config))
        #: the rows of each dataset whose prompt fits, by position in the dataset
        self.train_rows = self.screen.kept(range(len(self.train)), self._measure("row", self.train),
                                           f"--vf-env {self.name}'s training dataset")
        self.eval_rows = self.screen.kept(range(len(self.eval)), self._measure("eval row", self.eval),
                                          f"--vf-env {self.name}'s eval dataset")
        self._order: tuple[int, list[int]] | None = None

    @property
    def prompt_report(self) -> PromptReport:
        """What the start-up screen found (:class:`~plasmid.protocols.SupportsPromptReport`)."""
        return self.screen.report(f"--vf-env {self.name}")

    def _measure(self, kind: str, rows: list[dict[str, Any]]) -> Callable[[int], tuple[str, int]]:
        """``k -> (location, prompt length in tokens)`` of ``rows[k]``."""
        def measure(k: int) -> tuple[str, int]:
            where = f"verifiers {self.name} {kind} {k}"
            return where, len(self._item(rows[k], where)[1])

        return measure

    def _item(self, row: dict[str, Any], where: str) -> tuple[Any, list[int], dict[str, Any], dict[str, Any]]:
        prompt = row["prompt"]
        try:
            ids = self.tokenizer.apply_chat_template(prompt, tools=self.tools or None, add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)
        except Exception as exc:  # noqa: BLE001 - tokenizers raise bare Exceptions
            raise UsageError(f"{where}: the chat template of --model {self.model} cannot render the prompt "
                             f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        label = {"env": self.name, "env_args": self.args, "row": row}
        return prompt, [int(t) for t in ids], label, {"example_id": row.get("example_id")}

    def epoch_order(self, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            order = list(self.train_rows)
            random.Random(f"vf-epoch:{self.key}:{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def next_prompt(self) -> tuple[Any, list[int], Any, dict[str, Any]]:
        if self.position == len(self.train_rows):
            self.epoch, self.position = self.epoch + 1, 0
        k = self.epoch_order(self.epoch)[self.position]
        self.position += 1
        return self._item(self.train[k], f"verifiers {self.name} row {k}")

    def eval_groups(self) -> list[Group]:
        return [make_group(*self._item(self.eval[k], f"verifiers {self.name} eval row {k}"), copies=1,
                           first_sample_index=position, group_index=position)
                for position, k in enumerate(self.eval_rows)]

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.key, **self.stream_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("stream") != self.key:
            raise UsageError("the verifiers data source was saved for another dataset; resume with the same "
                             "--vf-env, --vf-env-args and --vf-seed (or --seed)")
        self.load_stream_state(state)
