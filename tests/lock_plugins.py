"""Third-party plugin wheels for the tests of what a run's lock records (tests/test_resume_used_plugins.py):
a package is written from source, built into a wheel and installed by pip into a directory of its
own; :func:`installed` puts that directory on ``sys.path`` (installing it for this process) and
takes it off again (uninstalling it).

The package of :func:`build_filter` is plugin ``lenfilt`` by default: the filter ``lenfilt``
(keeps every group) and the option ``--lenfilt-max-prompt-tokens`` (default 512).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from plasmid_e2e import pip

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{distribution}"
version = "{version}"
requires-python = ">=3.11"
dependencies = ["plasmid>=0.1,<0.2"]

[project.entry-points.plasmid]
{plugin} = "{module}.plugin"

[tool.setuptools.packages.find]
where = ["src"]
'''

PLUGIN = '''\
from plasmid import hookimpl
from plasmid.options import Options, option
from plasmid.types import Verdict


class {cls}Options(Options, group="{plugin}", description="test filter {plugin}"):
    {option}: int = option(512, "a limit nobody enforces", min=1)


class KeepAll:
    def __init__(self, config):
        self.limit = {cls}Options.of(config).{option}

    def __call__(self, group):
        return Verdict(True)


@hookimpl
def plasmid_addoption(parser):
    parser.add_options({cls}Options)


@hookimpl
def plasmid_filters(register):
    register("{filter}", KeepAll)
'''


def build_filter(target: Path, *, plugin: str = "lenfilt", distribution: str = "rl-plugin-lenfilt",
                 version: str = "0.1.0", filter_name: str = "", option: str = "") -> Path:
    """Build and pip-install (into ``target``, created) a distribution with plugin ``plugin``
    registering filter ``filter_name`` (default: the plugin's name) and declaring option
    ``option`` (default ``<plugin>_max_prompt_tokens``); returns ``target``."""
    module = distribution.replace("-", "_") + "_" + version.replace(".", "_")
    source = target.parent / f"{target.name}-src"
    (source / "src" / module).mkdir(parents=True)
    (source / "pyproject.toml").write_text(PYPROJECT.format(distribution=distribution, version=version,
                                                            plugin=plugin, module=module))
    (source / "src" / module / "__init__.py").write_text("")
    (source / "src" / module / "plugin.py").write_text(PLUGIN.format(
        cls=plugin.capitalize(), plugin=plugin, filter=filter_name or plugin,
        option=option or f"{plugin.replace('-', '_')}_max_prompt_tokens"))
    pip("install", "--no-deps", "--target", str(target), str(source))
    return target


@contextmanager
def installed(*targets: Path) -> Iterator[None]:
    """The distributions installed in ``targets`` are installed for this process inside the block."""
    for target in targets:
        sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        for target in targets:
            sys.path.remove(str(target))
        importlib.invalidate_caches()
