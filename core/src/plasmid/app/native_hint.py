"""Which package to install for an unknown ``--sglang-*``, ``--vllm-*`` or ``--megatron-*`` option.

A framework's native pass-through options exist only where its plasmid plugin and the framework
are both installed (they are read from the framework's source, :mod:`plasmid_serving.native_options`).
Without them ``--sglang-tp-size`` is an unknown option, and the closest known flag
(``--global-batch-size``) is no help. :func:`install_hint` turns that error, on the command line
(``unknown option --sglang-tp-size``, ``--no-`` forms too) or in a ``--config`` file
(``unknown option 'sglang_tp_size'``), into one line naming what to install; when the plugin and
the framework are both installed the option is a plain typo and the error is left as it is.
Nothing is imported: installation is looked up with ``importlib.util.find_spec`` and the
distributions' metadata.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from importlib import metadata


@dataclass(frozen=True)
class Framework:
    """A framework whose settings pass through as ``--<prefix>-*`` options.

    :ivar prefix: the flag prefix without dashes (``sglang``).
    :ivar label: its name in prose (``SGLang``).
    :ivar module: the import name that shows it is installed (``megatron.core``).
    :ivar install: the pip requirement of the framework (``megatron-core``).
    :ivar plugin: the distribution of the plasmid plugin that passes its settings through.
    :ivar plugin_dir: where that plugin's source lives in plasmid's repository.
    :ivar requirements: the repository's requirements file with the tested versions of both.
    """

    prefix: str
    label: str
    module: str
    install: str
    plugin: str
    plugin_dir: str
    requirements: str


FRAMEWORKS = (
    Framework("sglang", "SGLang", "sglang", "sglang", "plasmid-sglang", "plugins/generators/sglang",
              "requirements/sglang.txt"),
    Framework("vllm", "vLLM", "vllm", "vllm", "plasmid-vllm", "plugins/generators/vllm", "requirements/vllm.txt"),
    Framework("megatron", "Megatron", "megatron.core", "megatron-core", "plasmid-megatron",
              "plugins/trainers/megatron", "requirements/sglang.txt"),
)

#: An unknown-option error as the kernel's parser words it, for a flag or for a ``--config`` key.
UNKNOWN = re.compile(r"unknown option (?:--(?:no-)?(?P<flag>[a-z]+)-[\w-]*|'(?:no_)?(?P<key>[a-z]+)_\w*')")


def module_installed(name: str) -> bool:
    """Whether module ``name`` (dotted: ``megatron.core``) can be imported, found without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def distribution_installed(name: str) -> bool:
    """Whether the distribution ``name`` is installed."""
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def missing(framework: Framework) -> list[str]:
    """What of ``framework`` is not installed: its plugin's distribution and the framework's requirement."""
    gone = [framework.plugin] if not distribution_installed(framework.plugin) else []
    return gone + ([framework.install] if not module_installed(framework.module) else [])


def install_hint(message: str) -> str | None:
    """The one-line error to show instead of ``message`` (a parser's ``unknown option ...``) when it
    names a ``--sglang-*``/``--vllm-*``/``--megatron-*`` option whose plugin or framework is not
    installed; ``None`` for any other message, or when both are installed (a plain typo)."""
    found = UNKNOWN.search(message)
    if found is None:
        return None
    prefix = found.group("flag") or found.group("key")
    framework = next((f for f in FRAMEWORKS if f.prefix == prefix), None)
    if framework is None:
        return None
    gone = missing(framework)
    if not gone:
        return None
    option = message[found.start():].removeprefix("unknown option ").split(";")[0].split(" (")[0]
    where = message[:found.start()].rstrip(": ")
    return (f"{where + ': ' if where else ''}{option} is one of {framework.label}'s native options, which exist "
            f"only with {' and '.join(gone)} installed: pip install {' '.join(gone)} (the tested versions: "
            f"pip install -r {framework.requirements}; the plugin's source: {framework.plugin_dir})")


__all__ = ["FRAMEWORKS", "Framework", "install_hint", "missing"]
