"""``plasmid new-plugin reward NAME``: write a working third-party reward package to start from.

The package (``<dir>/plasmid-NAME/``) installs with pip, registers the reward ``NAME`` under the
entry-point group ``plasmid``, and passes its own tests, which subclass
:class:`plasmid.testing.RewardContract`::

    plasmid-NAME/
        pyproject.toml                      name, dependency on this kernel's minor version, entry point
        README.md                           install, test, use
        src/plasmid_NAME/__init__.py
        src/plasmid_NAME/plugin.py          the hooks: one option, the reward's registration
        src/plasmid_NAME/options.py         its options, declared once (flags, help, checks, typed values)
        src/plasmid_NAME/reward.py          the reward (label contained in the response); replace it
        tests/test_NAME_reward.py           the contract suite and a table of scores

``NAME`` is lower case letters, digits and dashes (``my-verifier``); the module is ``NAME`` with
underscores (``plasmid_my_verifier``).
"""

from __future__ import annotations

import re
from pathlib import Path

import plasmid
from plasmid.config import ArgumentParser
from plasmid.errors import UsageError

NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
FAMILIES = ("reward",)

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "plasmid-{name}"
version = "0.1.0"
description = "A plasmid reward plugin: {name}."
requires-python = ">=3.11"
dependencies = ["plasmid{kernel_range}"]

[project.entry-points.plasmid]
{name} = "{module}.plugin"

[tool.setuptools.packages.find]
where = ["src"]
'''

README = '''\
# plasmid-{name}

A plasmid reward plugin. It provides the reward `{name}`:
1.0 when the sample's label occurs in the response (case-insensitive unless
`--{name}-case-sensitive`), else 0.0. Replace `src/{module}/reward.py` with your own scoring.

    pip install -e .                       # plasmid discovers it through its entry point
    python -m pytest tests                 # the reward contract and the package's own tests
    plasmid plugins show {name}            # what it provides
    echo 'The answer is 42' | plasmid score --reward {name} --label 42
    plasmid train --reward {name} ...      # or --reward {name}:0.5 alongside other rewards
'''

INIT = '''\
"""plasmid-{name}: a plasmid reward plugin providing the reward ``{name}``."""
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
def plasmid_rewards(register):
    # A "module:attr" string: the module is imported only when the reward is chosen.
    register("{name}", "{module}.reward:{cls}")
'''

OPTIONS = '''\
"""The options of the ``{name}`` reward, declared once: flags, help, checks and typed values."""

from __future__ import annotations

from plasmid.options import Options, option


class {cls}Options(Options, group="{name}", description="the '{name}' reward"):
    {option}_case_sensitive: bool = option(False, "compare the label and the response with case")
'''

REWARD = '''\
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
'''

TEST = '''\
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
'''


def kernel_range() -> str:
    """``>=X.Y,<X.(Y+1)``: this kernel's minor version (plugins are built against one)."""
    major, minor = (int(part) for part in plasmid.__version__.split(".")[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def package_files(name: str) -> dict[str, str]:
    """Relative path -> text of every file of the reward package ``plasmid-<name>``."""
    module = "plasmid_" + name.replace("-", "_")
    values = {"name": name, "module": module, "option": name.replace("-", "_"),
              "cls": "".join(part.capitalize() for part in name.split("-")) + "Reward",
              "kernel_range": kernel_range()}
    short = name.replace("-", "_")
    return {
        "pyproject.toml": PYPROJECT.format(**values),
        "README.md": README.format(**values),
        f"src/{module}/__init__.py": INIT.format(**values),
        f"src/{module}/plugin.py": PLUGIN.format(**values),
        f"src/{module}/options.py": OPTIONS.format(**values),
        f"src/{module}/reward.py": REWARD.format(**values),
        f"tests/test_{short}_reward.py": TEST.format(**values),
    }


def write_package(family: str, name: str, directory: Path) -> Path:
    """Write the package for ``family`` provider ``name`` under ``directory``; its root."""
    if family not in FAMILIES:
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
    for relative, text in package_files(name).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def new_plugin_command(argv: list[str]) -> int:
    parser = ArgumentParser(prog="plasmid new-plugin", description="Write a plugin package to start from.")
    parser.add_argument("family", choices=FAMILIES, help="what the plugin provides")
    parser.add_argument("name", help="the provider's name (lower case, dashes): --reward NAME selects it")
    parser.add_argument("--dir", default=".", help="where to create plasmid-NAME/ (default: here)")
    args = parser.parse_args(argv)
    root = write_package(args.family, args.name, Path(args.dir))
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        print(path)
    print(f"\nnext: pip install -e {root} && python -m pytest {root / 'tests'}")
    return 0
