"""``plasmid new-plugin FAMILY NAME``: write a working third-party plugin package to start from.

Families (:data:`SPECS`): ``reward``, ``filter``, ``tool``, ``datasource``, ``loss``,
``generate``, ``engine``, ``trainer`` (no critic: its test skips the suite's two critic checks),
``weight-sync`` and ``observer`` (hooks, no provider). The package (``<dir>/rl-plugin-NAME/``, the
distribution ``rl-plugin-NAME`` unless ``--distribution`` names another) installs with pip,
registers provider ``NAME`` of its family under the entry-point group ``plasmid``, and passes
its own tests, which subclass the family's contract suite
(:mod:`plasmid.testing`; the loss, engine, trainer and weight-sync suites live in the
plasmid-torch library, the generate and observer suites in
:mod:`plasmid.testing.contracts.generate` and :mod:`plasmid.testing.contracts.observer`)::

    rl-plugin-NAME/
        pyproject.toml                      name, kernel minor-version range, entry point, [test] extra (pytest)
        README.md                           install, test, use
        src/plasmid_NAME/__init__.py
        src/plasmid_NAME/plugin.py          the hooks: its options, the provider's registration (an
                                            observer's run hooks)
        src/plasmid_NAME/options.py         its options, declared once (flags, help, checks, typed values)
        src/plasmid_NAME/<family>.py        the provider (a small working example); replace it
                                            (``weight_sync.py`` for ``weight-sync``)
        tests/test_NAME_<family>.py         the contract suite and tests of what the example does

Every file comes from one set of templates (:data:`PYPROJECT` ... :data:`OPTIONS`) filled with a
family's :class:`Spec`: its hook, class, options, implementation, test and usage lines.

``NAME`` is lower case letters, digits and dashes (``my-verifier``); the module is ``NAME`` with
underscores (``plasmid_my_verifier``). The distribution is never named like one of plasmid's own
(:data:`plasmid.plugins.FIRST_PARTY`, or ``plasmid-*``): those are this repository's, and a name
collision between plugins is won by a first-party one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import plasmid
from plasmid.config import ArgumentParser
from plasmid.errors import UsageError

NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
#: A distribution name as packaging accepts it (PEP 508).
DISTRIBUTION = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")

# ------------------------------------------------------------------------------------------ shared
PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "0.1.0"
description = "A plasmid {family} plugin: {name}."
requires-python = ">=3.11"
dependencies = [{dependencies}]

[project.optional-dependencies]
test = [{test_dependencies}]

[project.entry-points.plasmid]
{name} = "{module}.plugin"

[tool.setuptools.packages.find]
where = ["src"]
'''

README = '''\
# {distribution}

A plasmid {family} plugin. It provides the {family} `{name}`: {summary}
Replace `src/{module}/{impl}.py` with your own.

    pip install -e '.[test]'               # plasmid discovers it through its entry point
    python -m pytest tests                 # the {family} contract suite and the package's own tests
    plasmid plugins show {name}            # what it provides, with its options
{usage}
'''

INIT = '''\
"""{distribution}: a plasmid {family} plugin providing the {family} ``{name}``."""
'''

PLUGIN = '''\
"""Hook implementations of {distribution}."""

from __future__ import annotations

from plasmid import hookimpl
from {module}.options import {cls}Options


@hookimpl
def plasmid_addoption(parser):
    parser.add_options({cls}Options)


@hookimpl
def {hook}(register):
    # A "module:attr" string: the module is imported only when the {family} is chosen.
    register("{name}", "{module}.{impl}:{cls}")
'''

OPTIONS = '''\
"""The options of the ``{name}`` {family}, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.options import Options, option


class {cls}Options(Options, group="{name}", description="the '{name}' {family}"):
{options}
'''


@dataclass(frozen=True)
class Spec:
    """What a family's package differs in; every text is a template of :func:`values`' keys.

    :ivar hook: the registration hook (``plasmid_rewards``).
    :ivar suffix: the provider class's name suffix (``Reward``: ``MyVerifierReward``).
    :ivar summary: one sentence: what the example provider does.
    :ivar options: the options class's body (indented field declarations).
    :ivar implementation: ``src/<module>/<family>.py``.
    :ivar test: ``tests/test_<name>_<family>.py``, subclassing the family's contract suite.
    :ivar usage: README lines showing the provider in use.
    :ivar dependencies: requirements besides the kernel.
    :ivar test_dependencies: requirements of the tests besides pytest (the ``[test]`` extra).
    :ivar plugin: the ``plugin.py`` template (default :data:`PLUGIN`: options and the
        provider's registration; observers register no provider).
    """

    hook: str
    suffix: str
    summary: str
    options: str
    implementation: str
    test: str
    usage: str
    dependencies: tuple[str, ...] = ()
    test_dependencies: tuple[str, ...] = ()
    plugin: str = PLUGIN


# ------------------------------------------------------------------------------------------ reward
REWARD = Spec(
    hook="plasmid_rewards",
    suffix="Reward",
    summary="1.0 when the sample's label occurs in the response (case-insensitive unless "
            "`--{flag}-case-sensitive`), else 0.0.",
    options='''\
    {option}_case_sensitive: bool = option(False, "compare the label and the response with case")''',
    implementation='''\
"""The ``{name}`` reward."""

from __future__ import annotations

from plasmid.config import Config
from plasmid.types import Sample
from {module}.options import {cls}Options


class {cls}:
    """1.0 when the label occurs in the response, else 0.0.

    Built once per run as ``{cls}(config)``; called concurrently as ``await reward(sample)``, so
    it keeps no per-call state. Return a float, or a dict of named floats (``--reward-key``
    picks one). Raise on a sample it cannot score: the run records the failure with this
    plugin's name and scores the sample 0 (or stops, with ``--reward-errors fail``).
    """

    option_classes = ({cls}Options,)

    def __init__(self, config: Config) -> None:
        self.case_sensitive = {cls}Options.of(config).{option}_case_sensitive

    async def __call__(self, sample: Sample) -> float:
        if sample.label is None:
            raise ValueError(f"reward '{name}' needs a label; sample {{sample.index}} has none")
        response, label = sample.response, str(sample.label)
        if not self.case_sensitive:
            response, label = response.casefold(), label.casefold()
        return 1.0 if label and label in response else 0.0
''',
    test='''\
"""The ``{name}`` reward keeps plasmid's reward contract and scores what its docstring says."""

from __future__ import annotations

import pytest

import {module}.plugin
from plasmid.testing import RewardContract, build, make_config, run
from plasmid.types import Sample


class Test{cls}Contract(RewardContract):
    plugin = {module}.plugin
    provider = "{name}"
    cases = [("The answer is 42", "42"), ("no idea", "42"), ("PARIS", "paris"), ("", "x")]


@pytest.mark.parametrize(("response", "label", "case_sensitive", "expected"), [
    ("The answer is 42", "42", False, 1.0),
    ("The answer is 41", "42", False, 0.0),
    ("PARIS", "paris", False, 1.0),
    ("PARIS", "paris", True, 0.0),
])
def test_scores(response, label, case_sensitive, expected):
    config = make_config({module}.plugin, {option}_case_sensitive=case_sensitive)
    reward = build("reward", "{name}", {module}.plugin, config=config)
    assert run(reward(Sample(response=response, label=label))) == expected


def test_a_missing_label_is_an_error():
    reward = build("reward", "{name}", {module}.plugin)
    with pytest.raises(ValueError, match="needs a label"):
        run(reward(Sample(response="42", label=None)))
''',
    usage='''\
    echo 'The answer is 42' | plasmid score --reward {name} --label 42
    plasmid train --reward {name} ...      # or --reward {name}:0.5 alongside other rewards''',
)

# ------------------------------------------------------------------------------------------ filter
FILTER = Spec(
    hook="plasmid_filters",
    suffix="Filter",
    summary="drops a scored group whose rewards spread (max - min) by no more than "
            "`--{flag}-min-spread` (default 0: groups whose samples all scored the same), "
            "since such a group gives GRPO-style losses no signal.",
    options='''\
    {option}_min_spread: float = option(0.0, "drop groups whose rewards spread by no more than X", min=0.0)''',
    implementation='''\
"""The ``{name}`` group filter."""

from __future__ import annotations

from plasmid.config import Config
from plasmid.types import Group, Verdict
from {module}.options import {cls}Options


class {cls}:
    """Keeps a group whose rewards spread (max - min) by more than ``--{flag}-min-spread``.

    Built once per run as ``{cls}(config)``; called as ``filter(group)`` (plain, not async) on
    every scored group, in ``--filter`` order. It must not change the group, must give one group
    one verdict every time, and name the reason of every drop (drops are counted by reason).
    """

    option_classes = ({cls}Options,)

    def __init__(self, config: Config) -> None:
        self.min_spread = {cls}Options.of(config).{option}_min_spread

    def __call__(self, group: Group) -> Verdict:
        rewards = group.rewards
        if not rewards:
            return Verdict(False, "{name}: empty group")
        if max(rewards) - min(rewards) <= self.min_spread:
            return Verdict(False, f"{name}: reward spread <= {{self.min_spread:g}}")
        return Verdict(True)
''',
    test='''\
"""The ``{name}`` filter keeps plasmid's filter contract and keeps what its docstring says."""

from __future__ import annotations

import pytest

import {module}.plugin
from plasmid.testing import FilterContract, build, make_config
from plasmid.testing.contracts.filter import make_group


class Test{cls}Contract(FilterContract):
    plugin = {module}.plugin
    provider = "{name}"


@pytest.mark.parametrize(("rewards", "min_spread", "keep"), [
    ([1.0, 0.0, 1.0], 0.0, True),
    ([1.0, 1.0, 1.0], 0.0, False),
    ([0.5, 0.75], 0.25, False),
    ([0.5, 0.8], 0.25, True),
])
def test_keeps_groups_with_a_spread(rewards, min_spread, keep):
    config = make_config({module}.plugin, {option}_min_spread=min_spread)
    verdict = build("filter", "{name}", {module}.plugin, config=config)(make_group(rewards))
    assert verdict.keep is keep
    assert verdict.keep or "spread" in verdict.reason
''',
    usage='''\
    plasmid train --filter {name} --{flag}-min-spread 0.1 ...''',
)

# ------------------------------------------------------------------------------------------ tool
TOOL = Spec(
    hook="plasmid_tools",
    suffix="Tool",
    summary='a tool the policy calls as `{option}` with `{{"text": ...}}`; it answers with the '
            "text reversed (at most `--{flag}-max-chars` characters, else a tool error).",
    options='''\
    {option}_max_chars: int = option(1000, "the longest text the tool accepts", min=1)''',
    implementation='''\
"""The ``{name}`` tool."""

from __future__ import annotations

from typing import Any

from plasmid.config import Config
from plasmid.protocols import ToolError
from plasmid.types import Sample
from {module}.options import {cls}Options


class {cls}:
    """``{option}(text)``: the text reversed.

    Built once per run as ``{cls}(config)`` and called concurrently by many rollouts as
    ``await tool(arguments, sample)`` (keep no per-call state; read ``sample``, never write it).
    A bad call raises :class:`plasmid.protocols.ToolError`, whose message the model is shown.
    """

    option_classes = ({cls}Options,)
    name = "{option}"
    description = "Reverse a text."
    parameters: dict[str, Any] = {{
        "type": "object",
        "properties": {{"text": {{"type": "string", "description": "the text to reverse"}}}},
        "required": ["text"],
    }}

    def __init__(self, config: Config) -> None:
        self.max_chars = {cls}Options.of(config).{option}_max_chars

    async def __call__(self, arguments: dict[str, Any], sample: Sample) -> str:
        text = arguments.get("text")
        if not isinstance(text, str):
            raise ToolError(f"{option}: 'text' must be a string, not {{type(text).__name__}}")
        if len(text) > self.max_chars:
            raise ToolError(f"{option}: the text has {{len(text)}} characters, at most {{self.max_chars}} are allowed")
        return text[::-1]
''',
    test='''\
"""The ``{name}`` tool keeps plasmid's tool contract, answers what its docstring says, and is called
in a real multi-turn rollout (``--generate multiturn``) by a scripted policy, no model trained."""

from __future__ import annotations

import pytest

import {module}.plugin
from plasmid.protocols import ToolError
from plasmid.testing import ToolContract, build, make_config, run
from plasmid.testing.contracts.tool import make_call_sample
from plasmid.testing.toolcalls import formats_for, run_tool_call


class Test{cls}Contract(ToolContract):
    plugin = {module}.plugin
    provider = "{name}"
    valid_arguments = [{{"text": "abc"}}, {{"text": ""}}]
    invalid_arguments = [{{}}, {{"text": 3}}, {{"text": "x" * 1001}}]


def test_reverses():
    tool = build("tool", "{name}", {module}.plugin)
    assert run(tool({{"text": "stressed"}}, make_call_sample())) == "desserts"


def test_a_text_over_the_limit_is_a_tool_error():
    config = make_config({module}.plugin, {option}_max_chars=3)
    tool = build("tool", "{name}", {module}.plugin, config=config)
    with pytest.raises(ToolError, match="at most 3"):
        run(tool({{"text": "abcd"}}, make_call_sample()))


# formats_for: every --tool-call-format that can write the call (compact only calls the calculator)
@pytest.mark.parametrize("tool_call_format", formats_for("{option}", {{"text": "stressed"}}))
def test_a_multiturn_rollout_calls_it_and_records_its_answer(tool_call_format):
    rollout = run_tool_call({module}.plugin, "{name}", {{"text": "stressed"}}, tool_call_format=tool_call_format)
    assert rollout.metrics["tool_calls_mean"] == 1.0 and rollout.metrics["tool_errors_mean"] == 0.0
    assert len(rollout.outputs) == 1 and "desserts" in rollout.outputs[0]  # its answer, loss_mask 0


def test_a_bad_call_in_a_rollout_is_a_tool_error_the_model_reads():
    rollout = run_tool_call({module}.plugin, "{name}", {{"text": "abcd"}}, {option}_max_chars=3)
    assert rollout.metrics["tool_errors_mean"] == 1.0 and "at most 3" in rollout.outputs[0]
''',
    usage='''\
    plasmid train --generate multiturn --tools {name} ...''',
    test_dependencies=("plasmid-multiturn",),
)

# ------------------------------------------------------------------------------------------ datasource
DATASOURCE = Spec(
    hook="plasmid_datasources",
    suffix="Source",
    summary="`--{flag}-size` addition prompts (`a+b=`, label the sum) drawn from `--seed`, in a new "
            "order every epoch, with a fixed eval split of `--{flag}-eval-size` prompts; prompts are "
            "encoded with `--model`'s tokenizer (UTF-8 bytes when there is no model).",
    options='''\
    {option}_size: int = option(100, "training prompts", min=1)
    {option}_eval_size: int = option(10, "eval prompts", min=1)''',
    implementation='''\
"""The ``{name}`` data source."""

from __future__ import annotations

import random
from typing import Any

from plasmid.config import Config
from plasmid.groups import GroupStream, make_group
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.types import Group
from {module}.options import {cls}Options


class {cls}(GroupStream):
    """A :class:`plasmid.protocols.DataSource` of addition prompts.

    Item ``i`` is ``"a+b="`` with label ``str(a + b)``, ``a`` and ``b`` drawn from ``(seed, i)``.
    Items ``0 .. size-1`` are the training split, walked in a new seeded order every epoch;
    the next ``eval_size`` items the eval split. :class:`plasmid.groups.GroupStream` gives back
    groups first, numbers samples and groups, and saves that part of the state.
    """

    option_classes = ({cls}Options, GeneralOptions, RolloutOptions)

    def __init__(self, config: Config) -> None:
        options, general = {cls}Options.of(config), GeneralOptions.of(config)
        super().__init__(RolloutOptions.of(config).n_samples_per_prompt)
        self.size, self.eval_size, self.seed = options.{option}_size, options.{option}_eval_size, general.seed
        self.tokenizer: Any = None
        if general.model is not None:  # the run's model: encode prompts as it will read them
            import transformers

            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(general.model))

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            return list(prompt.encode())
        return list(self.tokenizer(prompt)["input_ids"])

    def example(self, item: int) -> tuple[str, str]:
        rng = random.Random(f"{{self.seed}}:{{item}}")
        a, b = rng.randrange(100), rng.randrange(100)
        return f"{{a}}+{{b}}=", str(a + b)

    def order(self, epoch: int) -> list[int]:
        items = list(range(self.size))
        random.Random(f"{{self.seed}}:epoch:{{epoch}}").shuffle(items)
        return items

    def next_prompt(self) -> tuple[str, list[int], str, dict[str, Any]]:
        if self.position == self.size:
            self.epoch, self.position = self.epoch + 1, 0
        item = self.order(self.epoch)[self.position]
        self.position += 1
        prompt, label = self.example(item)
        return prompt, self.encode(prompt), label, {{"source": "{name}", "item": item}}

    def eval_groups(self) -> list[Group]:
        groups = []
        for position in range(self.eval_size):
            item = self.size + position
            prompt, label = self.example(item)
            groups.append(make_group(prompt, self.encode(prompt), label, {{"source": "{name}", "item": item}},
                                     copies=1, first_sample_index=position, group_index=position))
        return groups

    def state_dict(self) -> dict[str, Any]:
        return {{"size": self.size, "seed": self.seed, **self.stream_state()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["size"], state["seed"]) != (self.size, self.seed):
            raise ValueError(f"datasource '{name}': the checkpoint was saved with size {{state['size']}} and seed "
                             f"{{state['seed']}}, this run has size {{self.size}} and seed {{self.seed}}")
        self.load_stream_state(state)
''',
    test='''\
"""The ``{name}`` data source keeps plasmid's data-source contract and serves what its docstring says."""

from __future__ import annotations

import pytest

import {module}.plugin
from plasmid.testing import DataSourceContract, build, make_config


class Test{cls}Contract(DataSourceContract):
    plugin = {module}.plugin
    provider = "{name}"


def make_source(**options):
    config = make_config({module}.plugin, datasource="{name}", **options)
    return build("datasource", "{name}", {module}.plugin, config=config)


def test_prompts_are_additions_labelled_with_their_sum():
    source = make_source()
    for group in source.get_groups(5) + source.eval_groups():
        sample = group.samples[0]
        a, b = sample.prompt.removesuffix("=").split("+")
        assert sample.label == str(int(a) + int(b))
        assert sample.tokens == list(sample.prompt.encode())


def test_a_state_of_another_seed_is_refused():
    other, source = make_source(seed=7), make_source()
    with pytest.raises(ValueError, match="seed 7"):
        source.load_state_dict(other.state_dict())
''',
    usage='''\
    plasmid train --datasource {name} --{flag}-size 1000 ...''',
)

# ------------------------------------------------------------------------------------------ loss
LOSS = Spec(
    hook="plasmid_losses",
    suffix="Loss",
    summary="REINFORCE with the group's mean reward as baseline (divided by the group's standard "
            "deviation unless `--no-{flag}-scale-by-std`), token-mean policy-gradient loss; no "
            "reference model, no critic.",
    options='''\
    {option}_scale_by_std: bool = option(True, "divide each group's advantages by its reward std")''',
    implementation='''\
"""The ``{name}`` loss (imports torch: it runs in the trainer's process)."""

from __future__ import annotations

from typing import Any

import torch

from plasmid.config import Config
from plasmid.types import LossBatch
from plasmid_torch import algorithms
from {module}.options import {cls}Options


class {cls}:
    """REINFORCE with a group baseline: advantage ``(r - mean_g) [/ std_g]`` on every response
    token; loss ``-sum(advantage * logprob * mask) / total_tokens``.

    Built once per run as ``{cls}(config)`` by the trainer. ``advantages`` sees the whole step's
    batch; ``policy_loss`` each micro-batch, normalised by the step's totals so that summed
    micro-batch losses (and metrics) equal the full batch's.
    """

    option_classes = ({cls}Options,)
    needs_ref = False
    needs_critic = False
    needs_old_logprobs = False

    def __init__(self, config: Config) -> None:
        self.scale_by_std = {cls}Options.of(config).{option}_scale_by_std

    def advantages(self, batch: LossBatch) -> tuple[torch.Tensor, None]:
        per_sample = algorithms.group_normalized_rewards(batch.rewards, batch.group_index,
                                                         scale_by_std=self.scale_by_std)
        return algorithms.broadcast_to_tokens(per_sample, batch.response_mask), None

    def policy_loss(self, batch: LossBatch, logprobs: torch.Tensor, entropy: Any) -> tuple[torch.Tensor,
                                                                                             dict[str, float]]:
        mask = batch.response_mask
        total = max(batch.total_tokens, 1)
        loss = -(batch.advantages * torch.where(mask > 0, logprobs, 0.0) * mask).sum() / total
        return loss, {{"loss/pg_loss": float(loss.detach())}}
''',
    test='''\
"""The ``{name}`` loss keeps plasmid's loss contract and computes what its docstring says."""

from __future__ import annotations

import torch

import {module}.plugin
from plasmid.testing import LossContract, build, make_config
from plasmid.types import LossBatch


class Test{cls}Contract(LossContract):
    plugin = {module}.plugin
    provider = "{name}"


def make_batch():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    return LossBatch(rewards=torch.tensor([1.0, 0.0, 2.0, 2.0]), group_index=torch.tensor([0, 0, 1, 1]),
                     response_mask=mask, old_logprobs=torch.zeros(4, 2), total_tokens=7, total_samples=4)


def make_loss(**options):
    return build("loss", "{name}", {module}.plugin, config=make_config({module}.plugin, **options))


def test_advantages_are_rewards_minus_the_group_mean():
    loss = make_loss({option}_scale_by_std=False)
    batch = make_batch()
    advantages, returns = loss.advantages(batch)
    assert returns is None
    assert torch.equal(advantages, torch.tensor([[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0], [0.0, 0.0]]))


def test_the_loss_is_the_token_mean_of_advantage_times_logprob():
    loss = make_loss({option}_scale_by_std=False)
    batch = make_batch()
    batch.advantages, _ = loss.advantages(batch)
    value, metrics = loss.policy_loss(batch, torch.full((4, 2), -1.0), None)
    assert torch.isclose(value, torch.tensor(0.5 / 7))
    assert metrics["loss/pg_loss"] == float(value)
''',
    usage='''\
    plasmid train --loss {name} ...                 # with a torch trainer (torchtrain, megatron)''',
    dependencies=("plasmid-torch", "torch"),
)

# ------------------------------------------------------------------------------------------ generate
GENERATE = Spec(
    hook="plasmid_generate_fns",
    suffix="Generate",
    summary="one engine call per prompt, like the built-in single-turn, whose response is trained "
            "on only up to `--{flag}-max-trained-tokens` tokens (0: every token; the rest keep "
            "`loss_mask` 0).",
    options='''\
    {option}_max_trained_tokens: int = option(0, "train on at most N response tokens (0: all)", min=0)''',
    implementation='''\
"""The ``{name}`` generate function."""

from __future__ import annotations

from plasmid.config import Config
from plasmid.protocols import RolloutView
from plasmid.types import Sample, SamplingParams, Status
from {module}.options import {cls}Options


class {cls}:
    """One engine call per sample; the response's first ``--{flag}-max-trained-tokens`` tokens
    are trained on (``loss_mask`` 1), the rest are not (0 means every token is).

    Built once per run as ``{cls}(config)``; called concurrently as
    ``await generate(ctx, sample, params)`` for every prompt sample. It must set ``tokens``
    (prompt + response), ``response``, ``response_length``, ``loss_mask``, ``rollout_logprobs``,
    ``status`` and ``weight_version`` (:class:`plasmid.protocols.GenerateFn`). Multi-turn logic
    (tools, environments) goes here: await ``ctx.engine_for(sample).generate`` per turn, give
    tokens the policy did not write ``loss_mask`` 0, and stop starting engine calls once
    ``ctx.aborting`` is set (return the sample ``ABORTED`` as it stands).
    """

    option_classes = ({cls}Options,)

    def __init__(self, config: Config) -> None:
        self.max_trained = {cls}Options.of(config).{option}_max_trained_tokens

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample:
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            return sample                       # finished earlier (a resumed step)
        if ctx.aborting.is_set():
            sample.status = Status.ABORTED
            return sample
        prompt = sample.prompt_tokens
        output = await ctx.engine_for(sample).generate(prompt, params)
        generated = list(output.token_ids)
        trained = len(generated) if self.max_trained == 0 else min(self.max_trained, len(generated))
        sample.tokens = prompt + generated
        sample.response_length = len(generated)
        sample.response = ctx.tokenizer.decode(generated, skip_special_tokens=True)
        sample.loss_mask = [1] * trained + [0] * (len(generated) - trained)
        sample.rollout_logprobs = list(output.logprobs)
        sample.status = output.status
        sample.weight_version = output.weight_version
        return sample
''',
    test='''\
"""The ``{name}`` generate function keeps plasmid's generate-function contract and masks what
its docstring says."""

from __future__ import annotations

import {module}.plugin
from plasmid.testing import build, make_config, run
from plasmid.testing.contracts.generate import GenerateContract, make_context
from plasmid.testing.scripted import Reply, ScriptedEngine
from plasmid.types import Sample, SamplingParams, Status


class Test{cls}Contract(GenerateContract):
    plugin = {module}.plugin
    provider = "{name}"


def generate_once(max_trained, reply):
    config = make_config({module}.plugin, generate="{name}", {option}_max_trained_tokens=max_trained)
    generate = build("generate", "{name}", {module}.plugin, config=config)
    engine = ScriptedEngine([reply])
    sample = Sample(prompt="ab", tokens=[1, 5, 6], response_length=0, status=Status.PENDING)
    params = SamplingParams(max_new_tokens=8, stop_token_ids=(2,))
    return run(generate(make_context(config, engine, generate), sample, params)), engine


def test_every_token_is_trained_by_default():
    sample, engine = generate_once(0, Reply([7, 8, 2]))
    assert engine.calls[0].prompt_ids == [1, 5, 6]
    assert sample.tokens == [1, 5, 6, 7, 8, 2] and sample.response_length == 3
    assert sample.loss_mask == [1, 1, 1] and sample.status is Status.COMPLETED


def test_tokens_past_the_limit_are_not_trained():
    sample, _ = generate_once(2, Reply([7, 8, 9, 10]))
    assert sample.loss_mask == [1, 1, 0, 0] and len(sample.rollout_logprobs) == 4
''',
    usage='''\
    plasmid train --generate {name} --{flag}-max-trained-tokens 256 ...''',
)

# ------------------------------------------------------------------------------------------ observer
OBSERVER_PLUGIN = '''\
"""Hook implementations of {distribution}: an observer (no provider to choose; its hooks run in
every run that loads the plugin, so each does nothing unless ``--{flag}`` is on)."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid.config import Config
from {module}.observer import {cls}
from {module}.options import {cls}Options

#: The observer of the run in progress (one run per process), or ``None``.
_observer: {cls} | None = None


@hookimpl
def plasmid_addoption(parser):
    parser.add_options({cls}Options)


@hookimpl
def plasmid_run_start(config: Config, run_dir: str) -> None:
    global _observer
    if {cls}Options.of(config).{option}:
        _observer = {cls}(config, run_dir)


@hookimpl
def plasmid_metrics(step: int, metrics: dict[str, float]) -> None:
    if _observer is not None:
        _observer.metrics(step, metrics)


@hookimpl
def plasmid_run_end(run_dir: str, metrics: dict[str, float], error: str | None) -> None:
    global _observer
    if _observer is not None:
        observer, _observer = _observer, None
        observer.close(error)
'''

OBSERVER = Spec(
    hook="",
    suffix="Observer",
    summary="with `--{flag}`, every step's metrics whose names start with `--{flag}-prefix` "
            "(default `rollout/`) are appended to `<run dir>/{name}.tsv` (step, name, value), and "
            "the run's end (`ok` or its error) is the last line.",
    options='''\
    {option}: bool = option(False, "append the run's metrics to <run dir>/{name}.tsv")
    {option}_prefix: str = option("rollout/", "only metrics whose names start with this")''',
    implementation='''\
"""The ``{name}`` observer: what it does with the run's events."""

from __future__ import annotations

import math
from pathlib import Path

from plasmid.config import Config
from {module}.options import {cls}Options


class {cls}:
    """Appends ``step<TAB>name<TAB>value`` to ``<run dir>/{name}.tsv`` for every finite metric
    whose name starts with ``--{flag}-prefix``, flushed after every step; ``close`` writes
    ``end<TAB>ok`` (or ``end<TAB>error<TAB><error>``) and closes the file.

    Opened at run start (:func:`plasmid.hookspecs.plasmid_run_start`), fed every step's metrics
    (``plasmid_metrics``), closed at run end (``plasmid_run_end``, also after a failure).
    Observers run in the driver, between steps: keep every call cheap, and never raise for a
    metric you do not understand (``metrics.jsonl`` is the run's record; this is a view of it).
    """

    def __init__(self, config: Config, run_dir: str) -> None:
        self.prefix = {cls}Options.of(config).{option}_prefix
        self.path = Path(run_dir) / "{name}.tsv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.path.open("a", encoding="utf-8")

    def metrics(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in sorted(metrics.items()):
            if not key.startswith(self.prefix) or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self.file.write(f"{{step}}\\t{{key}}\\t{{float(value)!r}}\\n")
        self.file.flush()

    def close(self, error: str | None) -> None:
        self.file.write("end\\tok\\n" if error is None else f"end\\terror\\t{{error}}\\n")
        self.file.close()
''',
    test='''\
"""The ``{name}`` observer keeps plasmid's observer contract and writes what its docstring says."""

from __future__ import annotations

import {module}.plugin
from plasmid.testing import make_config
from plasmid.testing.contracts.observer import ObserverContract


class Test{cls}Contract(ObserverContract):
    plugin = {module}.plugin
    config_options = {{"{option}": True}}


def lines(run_dir):
    return (run_dir / "{name}.tsv").read_text().splitlines()


def test_writes_the_prefixed_finite_metrics_of_every_step_then_the_end(tmp_path):
    plugin = {module}.plugin
    plugin.plasmid_run_start(config=make_config(plugin, {option}=True), run_dir=str(tmp_path))
    plugin.plasmid_metrics(step=0, metrics={{"rollout/reward_mean": 0.5, "train/loss": 1.0}})
    plugin.plasmid_metrics(step=1, metrics={{"rollout/reward_mean": float("nan"), "rollout/len": 3}})
    plugin.plasmid_run_end(run_dir=str(tmp_path), metrics={{}}, error="RuntimeError: boom")
    assert lines(tmp_path) == ["0\\trollout/reward_mean\\t0.5", "1\\trollout/len\\t3.0",
                               "end\\terror\\tRuntimeError: boom"]


def test_off_by_default_it_writes_nothing(tmp_path):
    plugin = {module}.plugin
    plugin.plasmid_run_start(config=make_config(plugin), run_dir=str(tmp_path))
    plugin.plasmid_metrics(step=0, metrics={{"rollout/reward_mean": 0.5}})
    plugin.plasmid_run_end(run_dir=str(tmp_path), metrics={{}}, error=None)
    assert not (tmp_path / "{name}.tsv").exists()
''',
    usage='''\
    plasmid train --{flag} --{flag}-prefix train/ ...''',
    plugin=OBSERVER_PLUGIN,
)

# ------------------------------------------------------------------------------------------ engine
ENGINE = Spec(
    hook="plasmid_generators",
    suffix="Engine",
    summary="a rollout engine that serves `--model` with plain Hugging Face transformers in this "
            "process (one request at a time, token by token with the KV cache; float32 on CPU, or "
            "`--{flag}-device`), for a start: replace the decoding loop with your inference server's client.",
    options='''\
    {option}_device: str = option("cpu", "the torch device the model is served on (cpu, cuda, cuda:1)")''',
    implementation='''\
"""The ``{name}`` rollout engine (imports torch: engines run where the model is served)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import transformers

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions
from plasmid.protocols import NamedTensor
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_torch.hf import load_causal_lm
from plasmid_torch.ops import logprobs_from_logits
from {module}.options import {cls}Options


class {cls}:
    """A :class:`plasmid.protocols.RolloutEngine` on ``--model``, built as ``{cls}(config)``.

    ``generate`` decodes one token per forward pass (with the KV cache) and yields to the event
    loop between tokens, so requests interleave and ``abort_all`` ends them at the next token
    (status ``ABORTED``). Sampling applies ``temperature`` (0: greedy), ``top_k`` and ``top_p``;
    the reported log-prob of each token is under ``softmax(logits / temperature)`` without the
    top-k/top-p cut (temperature 1 when greedy), which is what ``response_logprobs`` and the trainer
    compute. ``update_weights`` copies tensors (torch or numpy) into the served model by Hugging
    Face name, after checking every name and shape, and sets ``weight_version``.
    """

    option_classes = ({cls}Options, GeneralOptions)

    def __init__(self, config: Config) -> None:
        model = GeneralOptions.of(config).model
        if not model:
            raise UsageError("engine '{name}': --model is not set; give a local Hugging Face model directory")
        self.device = torch.device({cls}Options.of(config).{option}_device)
        self.model = load_causal_lm(str(model)).to(self.device)
        self.tensors = dict(self.model.state_dict(keep_vars=True))
        parameters = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.weight_version = 0
        self.in_flight = 0
        self.aborts = 0          # generations started before the latest abort_all end ABORTED

    @torch.inference_mode()
    def _forward(self, ids: list[int], cache: Any) -> torch.Tensor:
        """The next token's logits after ``ids``, which are appended to ``cache`` (a
        ``transformers.DynamicCache``; newer transformers call the argument ``cache``)."""
        out = self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True,
                         **{{self.cache_argument: cache}})
        return out.logits[0, -1].float()

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
        if params.temperature == 0:
            return int(logits.argmax())
        scaled = logits / params.temperature
        if params.top_k and params.top_k > 0:
            kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if params.top_p < 1.0:
            ordered, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(ordered, -1).cumsum(-1)
            cut = cumulative - torch.softmax(ordered, -1) > params.top_p
            scaled[order[cut]] = float("-inf")
        probs = torch.softmax(scaled, -1).cpu()
        return int(torch.multinomial(probs, 1, generator=generator))

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput:
        generator = torch.Generator()
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()
        started_at_abort, version = self.aborts, self.weight_version
        tokens: list[int] = []
        logprobs: list[float] = []
        status = Status.TRUNCATED
        self.in_flight += 1
        try:
            cache = transformers.DynamicCache()
            logits = self._forward(list(prompt_ids), cache)
            while len(tokens) < params.max_new_tokens:
                token = self._pick(logits, params, generator)
                tokens.append(token)
                logprobs.append(float(logprobs_from_logits(logits, torch.tensor(token, device=self.device),
                                                           params.temperature)))
                if token in params.stop_token_ids:
                    status = Status.COMPLETED
                    break
                await asyncio.sleep(0)      # let other requests and abort_all run
                if self.aborts != started_at_abort:
                    status = Status.ABORTED
                    break
                if len(tokens) < params.max_new_tokens:
                    logits = self._forward([token], cache)
        finally:
            self.in_flight -= 1
        return GenerationOutput(token_ids=tokens, logprobs=logprobs, status=status, weight_version=version)

    async def response_logprobs(self, token_ids: list[int], prompt_length: int, temperature: float) -> list[float]:
        with torch.inference_mode():
            ids = torch.tensor([token_ids], device=self.device)
            logits = self.model(input_ids=ids).logits[0, prompt_length - 1:-1]
            return [float(v) for v in logprobs_from_logits(logits, ids[0, prompt_length:], temperature).cpu()]

    async def abort_all(self) -> int:
        self.aborts += 1
        return self.in_flight

    async def update_weights(self, named_tensors: Iterable[NamedTensor], weight_version: int) -> None:
        updates = []
        for name, value in named_tensors:
            if name not in self.tensors:
                raise ValueError(f"engine '{name}': no tensor named '{{name}}' in the served model")
            tensor = value.detach() if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))
            if tuple(tensor.shape) != tuple(self.tensors[name].shape):
                raise ValueError(f"engine '{name}': tensor '{{name}}' has shape {{tuple(tensor.shape)}}, the model's "
                                 f"is {{tuple(self.tensors[name].shape)}}")
            updates.append((self.tensors[name], tensor))
        with torch.no_grad():
            for target, tensor in updates:
                target.copy_(tensor)
        self.weight_version = weight_version

    async def get_weights(self, names: Sequence[str]) -> dict[str, Any]:
        return {{name: self.tensors[name].detach().float().cpu().numpy().copy()
                 if self.tensors[name].dtype == torch.bfloat16 else self.tensors[name].detach().cpu().numpy().copy()
                 for name in names}}

    async def flush_cache(self) -> None:
        """No cache outlives a request here."""

    async def release_memory(self) -> None:
        """Nothing to release: the model stays where it is (a server would offload it)."""

    async def resume_memory(self) -> None:
        """Nothing was released."""

    async def shutdown(self) -> None:
        self.aborts += 1
''',
    test='''\
"""The ``{name}`` engine keeps plasmid's rollout-engine contract (a tiny model on CPU)."""

from __future__ import annotations

import pytest
import torch

import {module}.plugin
from plasmid.errors import UsageError
from plasmid.testing import GeneratorContract, build, make_config


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class Test{cls}Contract(GeneratorContract):
    plugin = {module}.plugin
    provider = "{name}"
    logprob_atol = 1e-4


def test_without_a_model_it_is_a_usage_error():
    with pytest.raises(UsageError, match="--model is not set"):
        build("engine", "{name}", {module}.plugin, config=make_config({module}.plugin))
''',
    usage='''\
    plasmid train --engine {name} --model PATH ...''',
    dependencies=("plasmid-torch", "torch", "transformers"),
)

# ------------------------------------------------------------------------------------------ weight sync
WEIGHT_SYNC = Spec(
    hook="plasmid_weight_syncs",
    suffix="Sync",
    summary="the trainer's weights, in buckets of `--update-weight-buffer-size` bytes, handed to "
            "every engine in this process (all at once, or one engine after another with "
            "`--no-{flag}-concurrent`), then every engine's cache flushed.",
    options='''\
    {option}_concurrent: bool = option(True, "update all engines at once (else one after another)")''',
    implementation='''\
"""The ``{name}`` weight sync."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from plasmid.config import Config
from plasmid.kernel_options import ScheduleOptions
from plasmid.protocols import RolloutEngine, Trainer
from plasmid.types import SyncReport
from {module}.options import {cls}Options


def nbytes(tensor: Any) -> int:
    """Bytes of a torch tensor's or numpy array's data."""
    return int(tensor.nbytes)


class {cls}:
    """A :class:`plasmid.protocols.WeightSync`, built as ``{cls}(config)``.

    ``await sync(trainer, engines, weight_version)``: for each bucket of
    ``trainer.export_weights(--update-weight-buffer-size)``, ``engine.update_weights(bucket,
    weight_version)`` on every engine, then ``flush_cache`` on each. Buckets are made one at a
    time, so the extra memory is about one bucket. The report counts the tensors' bytes, the
    buckets and the seconds. Engines in other processes or machines need a transport here
    (serialise each bucket, or broadcast it over a process group) instead of handing tensors over.
    """

    option_classes = ({cls}Options, ScheduleOptions)

    def __init__(self, config: Config) -> None:
        self.bucket_bytes = ScheduleOptions.of(config).update_weight_buffer_size
        self.concurrent = {cls}Options.of(config).{option}_concurrent

    async def sync(self, trainer: Trainer, engines: Sequence[RolloutEngine], weight_version: int) -> SyncReport:
        started = time.perf_counter()
        moved = buckets = 0
        for bucket in trainer.export_weights(self.bucket_bytes):
            if self.concurrent:
                await asyncio.gather(*(engine.update_weights(bucket, weight_version) for engine in engines))
            else:
                for engine in engines:
                    await engine.update_weights(bucket, weight_version)
            moved += sum(nbytes(tensor) for _, tensor in bucket)
            buckets += 1
        for engine in engines:
            await engine.flush_cache()
        return SyncReport(bytes=moved, seconds=time.perf_counter() - started, weight_version=weight_version,
                          buckets=buckets)
''',
    test='''\
"""The ``{name}`` weight sync keeps plasmid's weight-sync contract, moving weights from the
torchtrain trainer into torchgen engines in this process (the test needs those plugins)."""

from __future__ import annotations

import pytest
import torch

import {module}.plugin
from plasmid import testing
from plasmid.testing import WeightSyncContract

grpo = pytest.importorskip("plasmid_grpo.plugin")
torchtrain = pytest.importorskip("plasmid_torchtrain.plugin")
torchgen = pytest.importorskip("plasmid_torchgen.plugin")


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class Test{cls}Contract(WeightSyncContract):
    plugin = {module}.plugin
    provider = "{name}"
    extra_plugins = (grpo, torchtrain, torchgen)

    def make_trainer(self, config):
        loss = testing.build("loss", "grpo", grpo, config=config)
        return testing.build("trainer", "torchtrain", torchtrain, config=config, args=(loss,))

    def make_engines(self, config, count):
        return [testing.build("engine", "torchgen", torchgen, config=config) for _ in range(count)]


class Recorder:
    """A stand-in trainer and engine: two buckets out, every call recorded."""

    def __init__(self, calls, name="trainer"):
        self.calls, self.name = calls, name

    def export_weights(self, bucket_bytes):
        yield [("a", torch.zeros(4)), ("b", torch.zeros(2))]
        yield [("c", torch.zeros(8, dtype=torch.float16))]

    async def update_weights(self, bucket, weight_version):
        self.calls.append((self.name, [name for name, _ in bucket], weight_version))

    async def flush_cache(self):
        self.calls.append((self.name, "flush", None))


def test_one_after_another_sends_each_bucket_to_each_engine_in_turn_then_flushes():
    calls = []
    config = testing.make_config({module}.plugin, {option}_concurrent=False)
    sync = testing.build("weight_sync", "{name}", {module}.plugin, config=config)
    report = testing.run(sync.sync(Recorder(calls), [Recorder(calls, "e0"), Recorder(calls, "e1")], 5))
    assert calls == [("e0", ["a", "b"], 5), ("e1", ["a", "b"], 5), ("e0", ["c"], 5), ("e1", ["c"], 5),
                     ("e0", "flush", None), ("e1", "flush", None)]
    assert (report.bytes, report.buckets, report.weight_version) == (4 * 4 + 2 * 4 + 8 * 2, 2, 5)
''',
    usage='''\
    plasmid train --weight-sync {name} ...''',
    test_dependencies=("plasmid-torch", "torch", "plasmid-torchtrain", "plasmid-torchgen", "plasmid-grpo"),
)

# ------------------------------------------------------------------------------------------ trainer
TRAINER_PLUGIN = '''\
"""Hook implementations of {distribution}."""

from __future__ import annotations

from plasmid import hookimpl
from plasmid_torch.trainer_options import TrainerOptions
from {module}.options import {cls}Options


@hookimpl
def plasmid_addoption(parser):
    parser.add_options({cls}Options)
    parser.add_options(TrainerOptions)      # --lr, --clip-grad, ...: shared by every trainer


@hookimpl
def {hook}(register):
    # A "module:attr" string: the module is imported only when the {family} is chosen.
    register("{name}", "{module}.{impl}:{cls}")
'''

TRAINER = Spec(
    hook="plasmid_trainers",
    suffix="Trainer",
    summary="trains `--model` (a Hugging Face causal LM, float32 on the CPU) with the run's loss and "
            "AdamW, through plasmid-torch's train-step recipe (refused bad steps included); "
            "checkpoints hold a loadable `model/` directory. No critic, one process: a start.",
    options='''\
    {option}_micro_batch_samples: int = option(0, "samples per forward/backward (0: --micro-batch-size)", min=0)''',
    implementation='''\
"""The ``{name}`` trainer (imports torch: it runs in the trainer's process)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

from plasmid.config import Config
from plasmid.errors import UsageError
from plasmid.kernel_options import GeneralOptions, RolloutOptions
from plasmid.protocols import Loss
from plasmid.types import LossBatch, RolloutBatch, Sample
from plasmid_torch.hf import load_causal_lm, load_tokenizer
from plasmid_torch.ops import entropy_from_logits, logprobs_from_logits
from plasmid_torch.optimizer_update import optimizer_update
from plasmid_torch.step_guard import TorchSnapshot
from plasmid_torch.train_step import StepCounters, TrainerParts, TrainStep
from plasmid_torch.trainer_options import TrainerOptions
from plasmid_torch.training import check_trainer_setup, index_chunks, scheduled_updates
from {module}.options import {cls}Options

STATE = "trainer_state.pt"


def lr_multiplier(options: TrainerOptions, rollout: RolloutOptions) -> Callable[[int], float]:
    """``update -> lr / --lr``: linear warm-up over ``--lr-warmup-steps`` updates, then
    ``--lr-schedule`` (constant, linear or cosine to ``--min-lr``) over the run's updates."""
    total, warmup = scheduled_updates(options, rollout), options.lr_warmup_steps

    def multiplier(update: int) -> float:
        if update < warmup:
            return (update + 1) / warmup
        if options.lr_schedule == "constant":
            return 1.0
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        shape = 1.0 - progress if options.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return (options.min_lr + (options.lr - options.min_lr) * shape) / options.lr

    return multiplier


def response_logprobs(model: Any, samples: list[Sample], temperature: float, width: int,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[B, width]`` log-probs (and entropies) of each sample's response tokens under ``model``
    at ``temperature``, one forward pass per sample, zero beyond each response."""
    rows, entropies = [], []
    for sample in samples:
        ids = torch.tensor([sample.tokens])
        logits = model(input_ids=ids).logits[0, sample.prompt_length - 1:-1]
        pad = (0, width - sample.response_length)
        rows.append(torch.nn.functional.pad(logprobs_from_logits(logits, ids[0, sample.prompt_length:],
                                                                 temperature), pad))
        if with_entropy:
            entropies.append(torch.nn.functional.pad(entropy_from_logits(logits, temperature), pad))
    return torch.stack(rows), (torch.stack(entropies) if with_entropy else None)


class {cls}(StepCounters):
    """A :class:`plasmid.protocols.Trainer`, built by the kernel as ``{cls}(config, loss)``.

    ``train_step`` is :class:`plasmid_torch.train_step.TrainStep` with this trainer's parts
    (:meth:`_logprobs`, :meth:`_update`, :meth:`_snapshot`): old and reference log-probs,
    advantages, one AdamW update per ``--global-batch-size`` samples accumulated over
    micro-batches, and a bad step (non-finite loss or gradients, weights moved more than
    ``--max-update-ratio``) refused with weights, optimizer and schedule as they were. The model
    stays in eval mode (no dropout), so its log-probs match the engine's. ``save`` writes
    ``model/`` (weights and tokenizer, loadable with transformers) and the optimizer, schedule
    and counters; ``load`` restores them, so training continues bit for bit. A loss that needs a
    critic is refused: add a value model and :class:`plasmid_torch.train_step.CriticParts` for one.
    """

    option_classes = ({cls}Options, TrainerOptions, GeneralOptions, RolloutOptions)

    def __init__(self, config: Config, loss: Loss) -> None:
        general, rollout = GeneralOptions.of(config), RolloutOptions.of(config)
        check_trainer_setup("{name}", general, loss)
        if loss.needs_critic:
            raise UsageError(f"trainer '{name}': the loss {{type(loss).__name__}} needs a critic, which this trainer "
                             f"does not train")
        self.options = options = TrainerOptions.of(config)
        self.micro_batch = {cls}Options.of(config).{option}_micro_batch_samples or options.micro_batch_size
        self.loss, self.temperature = loss, rollout.temperature
        self.model_dir = Path(str(general.model))
        self.model = load_causal_lm(str(self.model_dir)).requires_grad_(True)
        self.reference = copy.deepcopy(self.model).requires_grad_(False) if loss.needs_ref else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=options.lr, weight_decay=options.weight_decay,
                                           betas=(options.adam_beta1, options.adam_beta2))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_multiplier(options, rollout))
        self.recipe = TrainStep(TrainerParts(loss=loss, policy=self.model, reference=self.reference,
                                             logprobs=self._logprobs, policy_update=self._update,
                                             snapshot=self._snapshot), options, temperature=self.temperature)

    # ------------------------------------------------------------------------------ the protocol
    async def logprobs(self, samples: list[Sample], temperature: float) -> list[list[float]]:
        if not samples:
            return []
        values = self._logprobs(self.model, samples, temperature)
        return [values[row, :sample.response_length].tolist() for row, sample in enumerate(samples)]

    async def train_step(self, batch: RolloutBatch) -> dict[str, float]:
        return self.recipe.run(batch)

    def export_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Copies of the weights by Hugging Face name (a tied tensor once, under its first name),
        in buckets of at most ``bucket_bytes`` bytes (a larger tensor alone)."""
        bucket: list[tuple[str, torch.Tensor]] = []
        size, seen = 0, set()
        for name, tensor in self.model.state_dict().items():
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor.detach().clone()))
            size += nbytes
        if bucket:
            yield bucket

    async def save(self, path: str) -> None:
        root = Path(path)
        self.model.save_pretrained(root / "model")
        load_tokenizer(str(self.model_dir)).save_pretrained(root / "model")
        torch.save({{"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    **self.recipe.counters()}}, root / STATE)

    async def load(self, path: str) -> None:
        root = Path(path)
        saved = transformers.AutoModelForCausalLM.from_pretrained(str(root / "model"), dtype=torch.float32)
        with torch.no_grad():
            self.model.load_state_dict(saved.state_dict())
        state = torch.load(root / STATE, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.recipe.restore(state)

    async def offload(self) -> None:
        """Nothing to do on the CPU (a GPU trainer colocated with engines moves its state here)."""

    async def onload(self) -> None:
        """Nothing was offloaded."""

    # ------------------------------------------------------------------- the train step's parts
    def _logprobs(self, model: Any, samples: list[Sample], temperature: float) -> torch.Tensor:
        with torch.no_grad():
            width = max(sample.response_length for sample in samples)
            return response_logprobs(model, samples, temperature, width)[0]

    def _update(self, batch: LossBatch, samples: list[Sample], chunk: list[int]) -> dict[str, float]:
        chunk_batch, chunk_samples = batch.select(torch.tensor(chunk)), [samples[i] for i in chunk]
        width = batch.response_mask.shape[1]

        def micro_losses() -> Iterator[tuple[torch.Tensor, dict[str, float]]]:
            for micro in index_chunks(len(chunk), self.micro_batch):
                logprobs, entropy = response_logprobs(self.model, [chunk_samples[i] for i in micro],
                                                      self.temperature, width, with_entropy=True)
                value, metrics = self.loss.policy_loss(chunk_batch.select(torch.tensor(micro)), logprobs, entropy)
                yield value, {{"loss": float(value.detach()), **metrics}}

        return optimizer_update(self.optimizer, self.scheduler, list(self.model.parameters()), micro_losses(),
                                clip_grad=self.options.clip_grad)

    def _snapshot(self) -> TorchSnapshot:
        return TorchSnapshot([p for p in self.model.parameters() if p.requires_grad], optimizers=[self.optimizer],
                             schedulers=[self.scheduler])
''',
    test='''\
"""The ``{name}`` trainer keeps plasmid's trainer contract (a tiny model on CPU), except the
critic checks: it trains no critic, and refuses a loss that needs one."""

from __future__ import annotations

import pytest
import torch

import {module}.plugin
from plasmid.errors import UsageError
from plasmid.testing import TrainerContract, build, make_config
from plasmid_torch.testing.contracts.trainer import ContractCriticLoss

NO_CRITIC = "this trainer trains no critic (refused: test_a_critic_loss_is_refused)"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


class Test{cls}Contract(TrainerContract):
    plugin = {module}.plugin
    provider = "{name}"

    @pytest.mark.skip(reason=NO_CRITIC)
    def test_critic_warmup_trains_only_the_critic_then_the_policy(self):
        pass

    @pytest.mark.skip(reason=NO_CRITIC)
    def test_a_nan_critic_loss_refuses_the_step_and_undoes_the_policy_update(self):
        pass


def test_a_critic_loss_is_refused(tmp_path):
    from plasmid_torch.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    config = make_config({module}.plugin, model=str(model), run_dir=tmp_path / "run")
    with pytest.raises(UsageError, match="needs a critic"):
        build("trainer", "{name}", {module}.plugin, config=config, args=(ContractCriticLoss(),))
''',
    usage='''\
    plasmid train --trainer {name} --model PATH ...''',
    dependencies=("plasmid-torch", "torch", "transformers"),
    plugin=TRAINER_PLUGIN,
)


#: Family -> what its scaffold differs in; :func:`write_package` accepts exactly these.
SPECS: dict[str, Spec] = {"reward": REWARD, "filter": FILTER, "tool": TOOL, "datasource": DATASOURCE, "loss": LOSS,
                          "generate": GENERATE, "engine": ENGINE, "trainer": TRAINER, "weight-sync": WEIGHT_SYNC,
                          "observer": OBSERVER}
FAMILIES = tuple(SPECS)


def kernel_range() -> str:
    """``>=X.Y,<X.(Y+1)``: this kernel's minor version (plugins are built against one)."""
    major, minor = (int(part) for part in plasmid.__version__.split(".")[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def values(family: str, name: str) -> dict[str, str]:
    """The template keys of provider ``name`` of ``family``: ``name``, ``module``, ``option``
    (Python identifier), ``flag`` (option-flag prefix), ``cls``, ``family``, ``hook``, ``impl``
    (the provider's module: the family with underscores)."""
    spec = SPECS[family]
    return {"name": name, "module": "plasmid_" + name.replace("-", "_"), "option": name.replace("-", "_"),
            "flag": name, "cls": "".join(part.capitalize() for part in name.split("-")) + spec.suffix,
            "family": family, "hook": spec.hook, "impl": family.replace("-", "_")}


def package_files(name: str, family: str = "reward", distribution: str = "") -> dict[str, str]:
    """Relative path -> text of every file of distribution ``distribution`` (default
    :func:`distribution_name` of ``name``) providing ``family`` ``name``."""
    spec, keys = SPECS[family], {**values(family, name), "distribution": distribution or distribution_name(name)}
    requirements = [f"plasmid{kernel_range()}", *spec.dependencies]
    filled = {
        **keys,
        "summary": spec.summary.format(**keys),
        "options": spec.options.format(**keys),
        "usage": spec.usage.format(**keys),
        "dependencies": ", ".join(f'"{requirement}"' for requirement in requirements),
        "test_dependencies": ", ".join(f'"{requirement}"' for requirement in ("pytest>=9.2", *spec.test_dependencies)),
    }
    module, short, impl = keys["module"], keys["option"], keys["impl"]
    return {
        "pyproject.toml": PYPROJECT.format(**filled),
        "README.md": README.format(**filled),
        f"src/{module}/__init__.py": INIT.format(**filled),
        f"src/{module}/plugin.py": spec.plugin.format(**filled),
        f"src/{module}/options.py": OPTIONS.format(**filled),
        f"src/{module}/{impl}.py": spec.implementation.format(**keys),
        f"tests/test_{short}_{impl}.py": spec.test.format(**keys),
    }


def distribution_name(name: str) -> str:
    """The distribution a scaffold of provider ``name`` proposes: ``rl-plugin-NAME``."""
    return f"rl-plugin-{name}"


def check_distribution(distribution: str) -> None:
    """:class:`UsageError` unless ``distribution`` is a valid distribution name that is not plasmid's
    own: in :data:`plasmid.plugins.FIRST_PARTY`, or ``plasmid``/``plasmid-*``, which would pass a
    third-party package off as one of this repository's."""
    from plasmid.plugins import is_first_party

    if not DISTRIBUTION.fullmatch(distribution):
        raise UsageError(f"plasmid new-plugin --distribution {distribution!r}: not a valid distribution name "
                         f"(letters, digits, '.', '_' and '-', e.g. rl-plugin-my-judge)")
    normalized = re.sub(r"[-_.]+", "-", distribution).lower()
    if is_first_party(normalized) or normalized.startswith("plasmid-"):
        raise UsageError(f"plasmid new-plugin --distribution {distribution}: plasmid and plasmid-* names are "
                         f"reserved for plasmid's own packages; choose another (e.g. rl-plugin-NAME)")


def write_package(family: str, name: str, directory: Path, distribution: str = "") -> Path:
    """Write the package for ``family`` provider ``name`` under ``directory``; its root, named after
    its distribution (``distribution``, by default :func:`distribution_name` of ``name``).

    Everything is checked (family, name, distribution, no installed plugin of that name, no
    existing directory) before anything is written; each fault is a :class:`UsageError`."""
    if family not in SPECS:
        raise UsageError(f"plasmid new-plugin {family}: only {', '.join(FAMILIES)} packages can be scaffolded")
    if not NAME.fullmatch(name):
        raise UsageError(f"plasmid new-plugin {family} {name!r}: a name is lower-case letters, digits and dashes, "
                         f"starting with a letter (e.g. my-verifier)")
    distribution = distribution or distribution_name(name)
    check_distribution(distribution)
    from plasmid.plugins import installed_entry_points

    installed = installed_entry_points()
    if name in installed:
        raise UsageError(f"a plasmid plugin named '{name}' is already installed ({installed[name].value}); "
                         f"choose another name, or the two would clash")
    root = directory / distribution
    if root.exists():
        raise UsageError(f"{root} already exists; choose another --dir or name")
    for relative, text in package_files(name, family, distribution).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def new_plugin_command(argv: list[str]) -> int:
    parser = ArgumentParser(prog="plasmid new-plugin", description="Write a plugin package to start from.")
    parser.add_argument("family", choices=FAMILIES, help="what the plugin provides")
    parser.add_argument("name", help="the provider's name (lower case, dashes): --FAMILY NAME selects it")
    parser.add_argument("--dir", default=".", help="where to create the package's directory (default: here)")
    parser.add_argument("--distribution", default="", metavar="DIST",
                        help="the package's distribution name, and its directory's (default: rl-plugin-NAME)")
    args = parser.parse_args(argv)
    root = write_package(args.family, args.name, Path(args.dir), args.distribution)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        print(path)
    print(f"\nnext: pip install -e '{root}[test]' && python -m pytest {root / 'tests'}")
    return 0
