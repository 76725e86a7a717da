"""The registries of tool-call and reasoning parsers, by name, and how packages add to them.

A package adds a parser by declaring an entry point in group :data:`TOOL_PARSER_GROUP`
(``plasmid.tool_parsers``) or :data:`REASONING_PARSER_GROUP` (``plasmid.reasoning_parsers``); the
entry point's name is the parser's name (what ``--tool-parser`` / ``--reasoning-parser`` take) and
its value a ``"module:attr"`` that is a parser class (built with no arguments) or instance::

    [project.entry-points."plasmid.tool_parsers"]
    my_model = "my_package.parsing:MyModelToolParser"

A tool parser extends :class:`plasmid_serving.parsers.base.ToolParser` (it implements ``spans``); a
reasoning parser has ``split`` (:class:`plasmid_serving.parsers.base.ReasoningParser`). Code may
also register one in its own process with :meth:`ParserRegistry.register` (a test, a ``--plugins``
module). The built-in parsers (:mod:`plasmid_serving.parsers.tools`,
:mod:`plasmid_serving.parsers.reasoning`, :mod:`plasmid_serving.parsers.harmony`) are registered
under vLLM's names and SGLang's where they differ. A name given twice (by two packages, or a
package and a built-in) is an error naming both.
Entry points are read at each lookup and imported only when their parser is asked for: lookups
happen at start-up, not per request.
"""

from __future__ import annotations

import importlib
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from plasmid.errors import PluginError, UsageError

TOOL_PARSER_GROUP = "plasmid.tool_parsers"
REASONING_PARSER_GROUP = "plasmid.reasoning_parsers"
BUILT_IN = "plasmid-serving (built in)"

_TOOLS = "plasmid_serving.parsers.tools"
_REASONING = "plasmid_serving.parsers.reasoning"
_HARMONY = "plasmid_serving.parsers.harmony"


class ParserRegistry:
    """Named parsers of one kind: the built-in ones, the entry points of group ``group`` and those
    registered in this process.

    :param kind: ``"tool"`` or ``"reasoning"``, for messages.
    :param flag: the option that names one, for messages.
    :param needs: the method a parser of this kind has.
    :param built_in: name -> ``"module:attr"`` of the built-in parsers.
    """

    def __init__(self, kind: str, group: str, flag: str, needs: str, built_in: dict[str, str]) -> None:
        self.kind, self.group, self.flag, self.needs = kind, group, flag, needs
        self._built_in = dict(built_in)
        self._registered: dict[str, tuple[str, Any]] = {}

    def register(self, name: str, parser: Any, origin: str = "") -> None:
        """Register ``parser`` (a class, an instance or a ``"module:attr"`` string) as ``name`` in
        this process; ``origin`` names who registered it in messages.

        :raises PluginError: ``name`` is taken.
        """
        taken = self._entries()
        if name in taken:
            raise PluginError(f"{self.kind} parser {name!r} is already registered by {taken[name][0]}")
        self._registered[name] = (origin or "register()", parser)

    def unregister(self, name: str) -> None:
        """Remove a parser :meth:`register` added (a test's cleanup); others are not removable."""
        self._registered.pop(name, None)

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._entries())

    def get(self, name: str) -> Any:
        """The parser registered as ``name`` (built anew when a class was registered).

        :raises UsageError: no parser has that name (the message lists them and the flag).
        :raises PluginError: it cannot be imported, or is not a parser of this kind.
        """
        entries = self._entries()
        if name not in entries:
            raise UsageError(f"{self.flag} {name!r}: choose one of {', '.join(sorted(entries))} (a package adds "
                             f"more through entry-point group {self.group!r})")
        origin, target = entries[name]
        try:
            if isinstance(target, EntryPoint):
                target = target.load()
            elif isinstance(target, str):
                module, _, attr = target.partition(":")
                target = getattr(importlib.import_module(module), attr)
            parser = target() if isinstance(target, type) else target
        except Exception as exc:  # a broken parser package is named with its error
            raise PluginError(f"{self.kind} parser {name!r} of {origin} cannot be loaded: "
                              f"{type(exc).__name__}: {exc}") from exc
        if not callable(getattr(parser, self.needs, None)):
            raise PluginError(f"{self.kind} parser {name!r} of {origin} has no {self.needs}() method: "
                              f"{type(parser).__qualname__} is not a {self.kind} parser")
        return parser

    def _entries(self) -> dict[str, tuple[str, Any]]:
        """name -> (origin, target), checking that no name is given twice."""
        entries: dict[str, tuple[str, Any]] = {name: (BUILT_IN, target) for name, target in self._built_in.items()}
        seen: set[tuple[str, str]] = set()
        for point in entry_points(group=self.group):
            if (point.name, point.value) in seen:
                continue  # one distribution found twice on the path
            seen.add((point.name, point.value))
            origin = f"package {point.dist.name}" if point.dist is not None else f"entry point {point.value}"
            self._add(entries, point.name, origin, point)
        for name, (origin, target) in self._registered.items():
            self._add(entries, name, origin, target)
        return entries

    def _add(self, entries: dict[str, tuple[str, Any]], name: str, origin: str, target: Any) -> None:
        if name in entries:
            raise PluginError(f"{self.kind} parser {name!r} is given by both {entries[name][0]} and {origin}; "
                              "uninstall one")
        entries[name] = (origin, target)


#: The tool parsers (``--tool-parser``).
TOOL_PARSERS = ParserRegistry("tool", TOOL_PARSER_GROUP, "--tool-parser", "spans", {
    "hermes": f"{_TOOLS}:Hermes", "qwen25": f"{_TOOLS}:Hermes",
    "llama3_json": f"{_TOOLS}:Llama3Json", "llama3": f"{_TOOLS}:Llama3Json",
    "mistral": f"{_TOOLS}:Mistral",
    "deepseek_v3": f"{_TOOLS}:DeepSeekV3", "deepseekv3": f"{_TOOLS}:DeepSeekV3",
    "qwen3_coder": f"{_TOOLS}:Qwen3Coder",
    "pythonic": f"{_TOOLS}:Pythonic",
    "openai": f"{_HARMONY}:Harmony", "gpt-oss": f"{_HARMONY}:Harmony",
})

#: The reasoning parsers (``--reasoning-parser``).
REASONING_PARSERS = ParserRegistry("reasoning", REASONING_PARSER_GROUP, "--reasoning-parser", "split", {
    "deepseek_r1": f"{_REASONING}:DeepSeekR1", "deepseek-r1": f"{_REASONING}:DeepSeekR1",
    "qwen3": f"{_REASONING}:Qwen3",
    "openai_gptoss": f"{_HARMONY}:GptOss", "gpt-oss": f"{_HARMONY}:GptOss",
})
