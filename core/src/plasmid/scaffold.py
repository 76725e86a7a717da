"""``plasmid new-plugin FAMILY NAME``: write a working third-party plugin package to start from.

Families: ``reward``, ``filter``, ``tool``, ``datasource`` and ``loss`` (the families whose
contract suite a small package can keep; :data:`SPECS`). The package (``<dir>/plasmid-NAME/``)
installs with pip, registers provider ``NAME`` of its family under the entry-point group
``plasmid``, and passes its own tests, which subclass the family's contract suite
(:mod:`plasmid.testing`; the loss suite lives in the plasmid-torch library)::

    plasmid-NAME/
        pyproject.toml                      name, kernel minor-version range, entry point, [test] extra (pytest)
        README.md                           install, test, use
        src/plasmid_NAME/__init__.py
        src/plasmid_NAME/plugin.py          the hooks: its options, the provider's registration
        src/plasmid_NAME/options.py         its options, declared once (flags, help, checks, typed values)
        src/plasmid_NAME/<family>.py        the provider (a small working example); replace it
        tests/test_NAME_<family>.py         the contract suite and tests of what the example does

Every file comes from one set of templates (:data:`PYPROJECT` ... :data:`OPTIONS`) filled with a
family's :class:`Spec`: its hook, class, options, implementation, test and usage lines.

``NAME`` is lower case letters, digits and dashes (``my-verifier``); the module is ``NAME`` with
underscores (``plasmid_my_verifier``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import plasmid
from plasmid.config import ArgumentParser
from plasmid.errors import UsageError

NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")

# ------------------------------------------------------------------------------------------ shared
PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "plasmid-{name}"
version = "0.1.0"
description = "A plasmid {family} plugin: {name}."
requires-python = ">=3.11"
dependencies = [{dependencies}]

[project.optional-dependencies]
test = ["pytest>=7"]

[project.entry-points.plasmid]
{name} = "{module}.plugin"

[tool.setuptools.packages.find]
where = ["src"]
'''

README = '''\
# plasmid-{name}

A plasmid {family} plugin. It provides the {family} `{name}`: {summary}
Replace `src/{module}/{impl}.py` with your own.

    pip install -e '.[test]'               # plasmid discovers it through its entry point
    python -m pytest tests                 # the {family} contract suite and the package's own tests
    plasmid plugins show {name}            # what it provides, with its options
{usage}
'''

INIT = '''\
"""plasmid-{name}: a plasmid {family} plugin providing the {family} ``{name}``."""
'''

PLUGIN = '''\
"""Hook implementations of plasmid-{name}."""

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
    """

    hook: str
    suffix: str
    summary: str
    options: str
    implementation: str
    test: str
    usage: str
    dependencies: tuple[str, ...] = ()


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
"""The ``{name}`` tool keeps plasmid's tool contract and answers what its docstring says."""

from __future__ import annotations

import pytest

import {module}.plugin
from plasmid.protocols import ToolError
from plasmid.testing import ToolContract, build, make_config, run
from plasmid.testing.contracts.tool import make_call_sample


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
''',
    usage='''\
    plasmid train --generate multiturn --tools {name} ...''',
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

#: Family -> what its scaffold differs in; :func:`write_package` accepts exactly these.
SPECS: dict[str, Spec] = {"reward": REWARD, "filter": FILTER, "tool": TOOL, "datasource": DATASOURCE, "loss": LOSS}
FAMILIES = tuple(SPECS)


def kernel_range() -> str:
    """``>=X.Y,<X.(Y+1)``: this kernel's minor version (plugins are built against one)."""
    major, minor = (int(part) for part in plasmid.__version__.split(".")[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def values(family: str, name: str) -> dict[str, str]:
    """The template keys of provider ``name`` of ``family``: ``name``, ``module``, ``option``
    (Python identifier), ``flag`` (option-flag prefix), ``cls``, ``family``, ``hook``, ``impl``."""
    spec = SPECS[family]
    return {"name": name, "module": "plasmid_" + name.replace("-", "_"), "option": name.replace("-", "_"),
            "flag": name, "cls": "".join(part.capitalize() for part in name.split("-")) + spec.suffix,
            "family": family, "hook": spec.hook, "impl": family}


def package_files(name: str, family: str = "reward") -> dict[str, str]:
    """Relative path -> text of every file of package ``plasmid-<name>`` providing ``family`` ``name``."""
    spec, keys = SPECS[family], values(family, name)
    requirements = [f"plasmid{kernel_range()}", *spec.dependencies]
    filled = {
        **keys,
        "summary": spec.summary.format(**keys),
        "options": spec.options.format(**keys),
        "usage": spec.usage.format(**keys),
        "dependencies": ", ".join(f'"{requirement}"' for requirement in requirements),
    }
    module, short = keys["module"], keys["option"]
    return {
        "pyproject.toml": PYPROJECT.format(**filled),
        "README.md": README.format(**filled),
        f"src/{module}/__init__.py": INIT.format(**filled),
        f"src/{module}/plugin.py": PLUGIN.format(**filled),
        f"src/{module}/options.py": OPTIONS.format(**filled),
        f"src/{module}/{family}.py": spec.implementation.format(**keys),
        f"tests/test_{short}_{family}.py": spec.test.format(**keys),
    }


def write_package(family: str, name: str, directory: Path) -> Path:
    """Write the package for ``family`` provider ``name`` under ``directory``; its root.

    Everything is checked (family, name, no installed plugin of that name, no existing
    directory) before anything is written; each fault is a :class:`UsageError`."""
    if family not in SPECS:
        raise UsageError(f"plasmid new-plugin {family}: only {', '.join(FAMILIES)} packages can be scaffolded")
    if not NAME.fullmatch(name):
        raise UsageError(f"plasmid new-plugin {family} {name!r}: a name is lower-case letters, digits and dashes, "
                         f"starting with a letter (e.g. my-verifier)")
    from plasmid.plugins import installed_entry_points

    installed = installed_entry_points()
    if name in installed:
        raise UsageError(f"a plasmid plugin named '{name}' is already installed ({installed[name].value}); "
                         f"choose another name, or the two would clash")
    root = directory / f"plasmid-{name}"
    if root.exists():
        raise UsageError(f"{root} already exists; choose another --dir or name")
    for relative, text in package_files(name, family).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def new_plugin_command(argv: list[str]) -> int:
    parser = ArgumentParser(prog="plasmid new-plugin", description="Write a plugin package to start from.")
    parser.add_argument("family", choices=FAMILIES, help="what the plugin provides")
    parser.add_argument("name", help="the provider's name (lower case, dashes): --FAMILY NAME selects it")
    parser.add_argument("--dir", default=".", help="where to create plasmid-NAME/ (default: here)")
    args = parser.parse_args(argv)
    root = write_package(args.family, args.name, Path(args.dir))
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        print(path)
    print(f"\nnext: pip install -e '{root}[test]' && python -m pytest {root / 'tests'}")
    return 0
