"""``python -m plasmid.app.docs_options --plugins LIST``: the options reference (``docs/options.md``).

Generated from the code, so that it cannot drift: for the kernel and each selected plugin, in
load order, the providers it registers (family, name, the first line of the factory's docstring)
and every option it declares (flag, default, help), as ``plasmid plugins show NAME`` reports them.
The page's header names the plugins and the command that wrote it; ``tests/test_docs_options.py``
regenerates it for the embedded plugin set (``requirements/embedded.txt``) and fails on any
difference.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import warnings
from typing import Any

from plasmid.app.helptext import default_text
from plasmid.app.introspect import plugin_options
from plasmid.config import ArgumentParser
from plasmid.errors import PlasmidError, PluginError
from plasmid.plugins import PluginManager, Selection, installed_entry_points
from plasmid.registry import Registry

COMMAND = "python -m plasmid.app.docs_options --plugins {plugins} > docs/options.md"


def cell(text: str) -> str:
    """``text`` as one Markdown table cell (pipes escaped, on one line)."""
    return " ".join(text.split()).replace("|", "\\|")


ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def markdown(rst: str) -> str:
    """Docstring text as Markdown: ````x```` and ``:func:`~a.b``` become ```x``` and ```b```."""
    text = ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", rst)
    return text.replace("``", "`")


def summary(factory: Any) -> str:
    """The first paragraph of the factory's docstring, on one line, as Markdown ('' if none)."""
    doc = inspect.getdoc(factory) or ""
    return markdown(" ".join(doc.split("\n\n", 1)[0].split()))


def providers_of(registry: Registry, name: str) -> list[tuple[str, str, str]]:
    """``(family, provider, summary)`` of every provider plugin ``name`` registers, sorted."""
    found = []
    for family, providers in registry.providers.items():
        for provider in providers.values():
            if provider.plugin.name == name:
                try:
                    text = summary(provider.load())
                except PluginError as exc:
                    text = f"(not importable: {exc})"
                found.append((family, provider.name, text))
    return sorted(found)


def help_text(help_: str, default: str) -> str:
    """The help without a trailing ``(default: X)`` that only repeats the default column."""
    return help_.removesuffix(f" (default: {default})")


def render(plugins: str) -> str:
    """The page for the plugin selection ``plugins`` (as ``--plugins`` takes it: ``a,b,c``),
    which must name every plugin itself (no autoload): the page depends on nothing else installed.

    :raises plasmid.errors.PluginError: a named plugin is not installed or does not load.
    """
    selection = Selection.parse(plugins, installed_entry_points())
    manager = PluginManager()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        manager.load(selection)
    registry = Registry.collect(manager)
    names = [name for name, info in manager.infos.items() if info.status in ("loaded", "kernel")]
    lines = [
        "# Options of the built-in plugins",
        "",
        "<!-- Generated from the code; do not edit. Regenerate with:",
        f"     {COMMAND.format(plugins=plugins)} -->",
        "",
        "Every option of the kernel and of these plugins, with its default, as `plasmid train --help-all` "
        "and `plasmid plugins show NAME` show them. Any option can also be given in a `--config` file under "
        "its destination name (`--num-rollouts` is `num_rollouts:`).",
        "",
        f"Plugins covered: {', '.join(f'`{name}`' for name in names)}.",
        "",
    ]
    for name in names:
        info = manager.infos[name]
        providers = providers_of(registry, name)
        options = plugin_options(manager, name)
        if not providers and not options:
            continue
        lines += [f"## {name}", "", f"Distribution `{info.distribution}`."]
        if providers:
            lines += [""] + [f"- {family} `{provider}`: {cell(text) or '(no summary)'}"
                             for family, provider, text in providers]
        if options:
            lines += ["", "| option | default | meaning |", "|---|---|---|"]
            for option in options:
                default = default_text(option["default"])
                lines.append(f"| `{option['flag']}` | `{cell(default)}` | {cell(help_text(option['help'], default))} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command: the page on stdout, 0; a bad selection or argument is one line on stderr, 2."""
    try:
        return write_page(argv)
    except PlasmidError as exc:
        print(f"plasmid: error: {exc}", file=sys.stderr)
        return 2


def write_page(argv: list[str] | None) -> int:
    parser = ArgumentParser(prog="python -m plasmid.app.docs_options",
                            description="Print the options reference (Markdown) of the selected plugins.")
    parser.add_argument("--plugins", required=True, help="the plugins to document, as for plasmid train (a,b,c)")
    args = parser.parse_args(argv)
    os.environ.pop("PLASMID_PLUGINS", None)
    sys.stdout.write(render(args.plugins))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
