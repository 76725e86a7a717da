"""``python -m plasmid.app.docs_hooks``: the hook and API reference (``docs/hooks.md``).

Generated from the code, so that it cannot drift: every hook of :mod:`plasmid.hookspecs` with its
signature, who calls it and when, its result rule (from the hookspec's ``firstresult`` and
``historic`` markers) and its docstring; every provider protocol of the family table
(:data:`plasmid.families.FAMILIES`) and the optional capabilities of :mod:`plasmid.protocols`,
with their methods' signatures; the data types of :mod:`plasmid.types`; the ``plasmid.commands``
contract; and the testing kit (:mod:`plasmid.testing`, :mod:`plasmid.testing.toolcalls`,
``plasmid.testing.build_tiny_model``). ``tests/test_docs_hooks.py`` regenerates it and fails on
any difference.

What the hookspec docstrings leave to the caller (who calls a hook, in which process and phase)
is in :data:`CALLERS`, one entry per hook; a hook without one stops the generator, so a new hook
cannot reach the page undocumented.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import plasmid.hookspecs as hookspecs
import plasmid.protocols as protocols
import plasmid.types as types
from plasmid.app.cli import COMMAND_GROUP
from plasmid.app.docs_options import markdown
from plasmid.families import FAMILIES, Family

COMMAND = "python -m plasmid.app.docs_hooks > docs/hooks.md"

#: Hook -> who calls it and when (what the hookspecs' docstrings leave to the caller).
CALLERS: dict[str, str] = {
    "plasmid_addoption": "by the start-up of every command that takes the run's options "
                         "(:func:`plasmid.startup.start`: `plasmid train`, `config show`, `rollout`, `replay`, "
                         "`score`, `eval`), by `plasmid plugins show` and by :func:`plasmid.testing.make_config`, "
                         "right after the registration hooks.",
    "plasmid_defaults": "by :func:`plasmid.startup.finish_configuration` (the same start-ups, and "
                        ":func:`plasmid.testing.make_config`), in the driver process.",
    "plasmid_configure": "by :func:`plasmid.startup.finish_configuration` right after the defaults hooks "
                         "and the options checks, in the driver process.",
    "plasmid_run_start": "by `plasmid train` and `plasmid replay` as the last step of start-up "
                         "(:func:`plasmid.app.run.announce`).",
    "plasmid_run_end": "by `plasmid train` and `plasmid replay` (:func:`plasmid.app.run.observed_train`).",
    "plasmid_metrics": "by :meth:`plasmid.loop.Loop.end_step` and by `plasmid rollout` once per batch.",
    "plasmid_step_end": "by :meth:`plasmid.loop.Loop.end_step`.",
    "plasmid_weights_synced": "by :meth:`plasmid.loop.Loop.sync`.",
}

#: How the kernel calls the registration hooks, whatever the family.
REGISTRATION = ("Each is called once per process by :meth:`plasmid.registry.Registry.collect`, right after the plugins "
                "load and before the options are declared (so before any option has a value): in the driver "
                "at start-up and in every worker process that loads the run's plugin lock "
                "(:func:`plasmid.providers.lock_registry`). Each plugin's implementation is called on its own, in "
                "plugin rank order (the kernel's plugins, then first-party ones, then the rest), with a "
                "`register` of its own; one that raises drops that plugin's providers (an auto-loaded plugin) or "
                "stops the start-up (a plugin selected with `--plugins`).")

CARDINALITY = {"one": "a run uses exactly one (the flag's choice, the only candidate, or the default)",
               "weighted": "a run uses one or more, each with a weight (`NAME[:WEIGHT]`, repeatable)",
               "ordered": "a run uses zero or more, in the order given (repeatable, or comma-separated)"}

#: The optional capabilities and helper protocols documented after the families, in this order.
EXTRA_PROTOCOLS = ("RolloutView", "Register", "Factory", "ToolError", "CriticLoss", "SupportsEosIds",
                   "SupportsPromptReport", "SupportsStats", "SupportsDiskWeights", "SupportsRestarts",
                   "SupportsWeightSharing", "SupportsSharedWeights", "SupportsSyncStart", "SupportsValues",
                   "SupportsMinSamples", "SupportsOldLogprobsDeclaration", "SupportsReferenceScores",
                   "SupportsTrainingSamples")

#: What each field of the data a plugin reads and writes holds (the classes' docstrings say what
#: the fields are together); a dataclass listed here without a note for a field stops the generator.
FIELD_NOTES: dict[str, dict[str, str]] = {
    "Sample": {
        "prompt": "the prompt: text, or chat messages [{'role': ..., 'content': ...}]",
        "tokens": "the prompt's ids, then the response's",
        "response": "the response's text (special tokens left out)",
        "response_length": "how many of tokens are the response (the last ones)",
        "loss_mask": "per response token: 1 trained on, 0 not (tool output); None: all trained",
        "rollout_logprobs": "the engine's log-prob per response token (0.0 on tokens it did not write)",
        "reward": "the weighted sum of the rewards; None until scored",
        "reward_components": "each reward's value by name (RewardParts' parts as 'reward.part')",
        "label": "the data source's reference answer (rewards and tools read it)",
        "metadata": "free-form; SUBSET_KEY, ROUTED_EXPERTS_KEY and generate functions' keys",
        "status": "PENDING until generated, then COMPLETED, TRUNCATED, ABORTED or FAILED",
        "weight_version": "the engine's weight version that generated the response",
        "index": "unique running number, given by the data source",
        "group_index": "the group's index: the samples of one prompt share it",
    },
    "SamplingParams": {
        "temperature": "0 is greedy",
        "top_p": "nucleus mass kept, in (0, 1]; 1 keeps all",
        "top_k": "likeliest tokens kept; <= 0 keeps all",
        "max_new_tokens": "longest response, in tokens (>= 1)",
        "stop_token_ids": "ids that end the response (kept in it)",
        "seed": "a request's seed, for engines that take one; None: unseeded",
        "stop": "strings that end the response once its text contains one (the token completing it kept)",
    },
}

#: The testing kit's entries: ``(module, name)``; ``build_tiny_model`` and ``tiny_config`` need the
#: plasmid-torch library (:data:`plasmid.families.TESTING_EXTRAS`).
KIT = (("plasmid.testing", "make_config"), ("plasmid.testing", "build"), ("plasmid.testing", "make_registry"),
       ("plasmid.testing", "make_manager"), ("plasmid.testing", "run"),
       ("plasmid.testing.toolcalls", "run_tool_call"), ("plasmid.testing.toolcalls", "ToolCallRollout"),
       ("plasmid.testing.toolcalls", "formats_for"), ("plasmid.testing.toolcalls", "call_text"),
       ("plasmid.testing.toolcalls", "ToolCallPolicy"), ("plasmid.testing.toolcalls", "ByteTokenizer"),
       ("plasmid.testing.toolcalls", "masked_outputs"),
       ("plasmid.testing.scripted", "ScriptedEngine"), ("plasmid.testing.scripted", "Reply"),
       ("plasmid.testing.conversation", "RecordingEngine"),
       ("plasmid.testing.conversation", "check_token_in_token_out"),
       ("plasmid.testing", "build_tiny_model"), ("plasmid.testing", "tiny_config"))


FIELD = re.compile(r"^:(param|ivar|raises|returns?)\s*([^:]*):\s*", re.MULTILINE)


def field_line(match: re.Match[str]) -> str:
    kind, name = match.group(1), match.group(2).strip()
    if kind in ("param", "ivar"):
        return f"- `{name}`: "
    return f"- raises `{name}`: " if kind == "raises" else "- returns: "


def text_of(obj: Any) -> str:
    """``obj``'s docstring as Markdown (``''`` if none): roles and double backticks as code, the
    ``:param x:``/``:ivar x:``/``:raises X:``/``:returns:`` fields as list items, ``::`` as ``:``."""
    text = markdown(inspect.getdoc(obj) or "")
    return FIELD.sub(field_line, re.sub(r"::$", ":", text, flags=re.MULTILINE))


def default_text(value: Any) -> str:
    """A default as source code (an enum member as ``Status.PENDING``)."""
    return f"{type(value).__name__}.{value.name}" if isinstance(value, enum.Enum) else repr(value)


def own_doc(obj: Any) -> str:
    """``obj``'s own docstring as Markdown, not one inherited (``object.__call__``'s)."""
    doc = getattr(obj, "__doc__", None)
    return markdown(inspect.cleandoc(doc)) if isinstance(doc, str) else ""


def annotation(value: Any) -> str:
    """An annotation as written in the source (they are strings: ``from __future__ import annotations``)."""
    if value is inspect.Parameter.empty:
        return ""
    return value if isinstance(value, str) else getattr(value, "__name__", repr(value))


def signature(function: Callable[..., Any], name: str | None = None, *, skip_self: bool = False) -> str:
    """``name(arg: type = default, ...) -> type`` as the source declares it."""
    sig = inspect.signature(function)
    parts, star_done = [], False
    params = list(sig.parameters.values())[1 if skip_self else 0:]
    for param in params:
        if param.kind is param.KEYWORD_ONLY and not star_done:
            parts.append("*")
        if param.kind in (param.VAR_POSITIONAL, param.KEYWORD_ONLY):
            star_done = True
        stars = "*" if param.kind is param.VAR_POSITIONAL else "**" if param.kind is param.VAR_KEYWORD else ""
        text = stars + param.name
        if param.annotation is not param.empty:
            text += f": {annotation(param.annotation)}"
        if param.default is not param.empty:
            text += (f" = {default_text(param.default)}" if param.annotation is not param.empty
                     else f"={default_text(param.default)}")
        parts.append(text)
    returns = f" -> {annotation(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    prefix = "async def " if inspect.iscoroutinefunction(function) else "def "
    return f"{prefix}{name or function.__name__}({', '.join(parts)}){returns}"


def spec_of(name: str) -> dict[str, Any]:
    """The hookspec options of hook ``name`` (``firstresult``, ``historic``, ...)."""
    spec: dict[str, Any] = vars(getattr(hookspecs, name))["plasmid_spec"]
    return spec


def hook_group(name: str) -> str:
    if spec_of(name)["historic"]:
        return "bootstrap"
    return "registration" if any(family.hook == name for family in FAMILIES) else "observer"


def result_rule(name: str) -> str:
    """The hook's result rule, from its hookspec markers (and how the kernel calls it)."""
    spec = spec_of(name)
    if spec["firstresult"]:
        return ("firstresult: implementations are called until one returns something other than `None`, which is "
                "the result; `None` means no answer (the next implementation is asked).")
    if hook_group(name) == "registration":
        return ("collected: every loaded plugin's implementation is called once; what counts is what it passes to "
                "`register`, the return value is ignored (return `None`).")
    historic = (" Historic: a plugin registered after the call is called at once, with the same arguments."
                if spec["historic"] else "")
    return ("collected: every implementation is called (pluggy's order: the plugin registered last first); the "
            "kernel ignores the returned values, so return `None`." + historic)


def hook_names() -> list[str]:
    """The hooks of :mod:`plasmid.hookspecs`, in source order."""
    found = [(fn.__code__.co_firstlineno, name) for name, fn in vars(hookspecs).items()
             if name.startswith("plasmid_") and hasattr(fn, "plasmid_spec")]
    return [name for _, name in sorted(found)]


def family_of(hook: str) -> Family:
    return next(family for family in FAMILIES if family.hook == hook)


def hook_section(name: str) -> list[str]:
    function = getattr(hookspecs, name)
    summary, _, rest = text_of(function).partition("\n\n")
    lines = [f"### `{name}`", "", "```python", "@hookimpl", signature(function) + ": ...", "```", "",
             " ".join(summary.split()), ""]
    if hook_group(name) == "registration":
        family = family_of(name)
        args = ", ".join(("config", *family.factory_args))
        lines += [f"- **Family**: `{family.name}`, chosen with `{family.flag}`: {CARDINALITY[family.cardinality]}. "
                  f"Its factory is called as `factory({args})` and returns a "
                  f"[`{family.protocol}`](#{family.protocol.lower()}).",
                  "- **Called**: once per process, at start-up (see [registration hooks](#registration-hooks))."]
    else:
        if name not in CALLERS:
            raise KeyError(f"hook {name} has no entry in plasmid.app.docs_hooks.CALLERS (who calls it, and when)")
        lines.append(f"- **Called**: {markdown(CALLERS[name])}")
    lines += [f"- **Result**: {result_rule(name)}", ""] + ([rest, ""] if rest else [])
    return lines


def members(cls: type) -> list[str]:
    """``cls``'s own declared attributes and methods, as code lines, in source order."""
    out = []
    own = {key: value for key, value in vars(cls).items() if not key.startswith("_") or key == "__call__"}
    for attr, kind in getattr(cls, "__annotations__", {}).items():
        if attr not in own or not callable(own[attr]):
            out.append(f"{attr}: {annotation(kind)}")
    for key, value in own.items():
        if isinstance(value, property) and value.fget is not None:
            returns = annotation(inspect.signature(value.fget).return_annotation)
            out.append(f"@property\ndef {key}(self) -> {returns}: ...")
        elif inspect.isfunction(value):
            out.append(signature(value, key, skip_self=True).replace("(", "(self, ", 1).replace("(self, )", "(self)")
                       + ": ...")
    return out


def method_docs(cls: type) -> list[str]:
    """``- `name`: docstring`` for every own method or property of ``cls`` with a docstring."""
    out = []
    for key, value in vars(cls).items():
        if key.startswith("_") and key != "__call__":
            continue
        target = value.fget if isinstance(value, property) else value
        if inspect.isfunction(target) and own_doc(target):
            out.append(f"- `{key}`: {' '.join(own_doc(target).split())}")
    return out


def class_section(cls: type, heading: str = "###", title: str | None = None) -> list[str]:
    lines = [f"{heading} `{title or cls.__name__}`", ""]
    if dataclasses.is_dataclass(cls):
        lines += ["```python", f"@dataclass{'(frozen=True)' if cls.__dataclass_params__.frozen else ''}",  # type: ignore[attr-defined]
                  f"class {cls.__name__}:"]
        notes = FIELD_NOTES.get(cls.__name__, {})
        for item in dataclasses.fields(cls):
            default = ""
            if item.default is not dataclasses.MISSING:
                default = f" = {default_text(item.default)}"
            elif item.default_factory is not dataclasses.MISSING:
                default = f" = field(default_factory={getattr(item.default_factory, '__name__', '...')})"
            if notes and item.name not in notes:
                raise KeyError(f"{cls.__name__}.{item.name} has no note in plasmid.app.docs_hooks.FIELD_NOTES")
            note = f"  # {notes[item.name]}" if item.name in notes else ""
            lines.append(f"    {item.name}: {annotation(item.type)}{default}{note}")
        extra = [m for m in members(cls) if "\n" in m]  # properties
        lines += [("    " + m.replace("\n", "\n    ")) for m in extra] + ["```", ""]
    elif isinstance(cls, type) and issubclass(cls, enum.Enum):
        lines += ["```python", f"class {cls.__name__}({cls.__mro__[1].__name__}):"]
        lines += [f"    {member.name} = {member.value!r}" for member in cls] + ["```", ""]
    else:
        bases = [base.__name__ for base in cls.__bases__ if base is not object]
        body = members(cls)
        lines += ["```python", f"class {cls.__name__}({', '.join(bases)}):" if bases else f"class {cls.__name__}:"]
        lines += [("    " + m.replace("\n", "\n    ")) for m in body] or ["    ..."]
        lines += ["```", ""]
    lines += [text_of(cls), ""]
    docs = method_docs(cls)
    if docs:
        lines += docs + [""]
    return lines


def protocol_class(family: Family) -> type:
    if hasattr(protocols, family.protocol):
        cls: type = getattr(protocols, family.protocol)
        return cls
    from plasmid.session import Runtime  # the runtime family's protocol lives with the session

    return Runtime


def kit_section(module_name: str, name: str) -> list[str]:
    try:
        target = getattr(importlib.import_module(module_name), name)
    except ImportError as exc:
        return [f"### `{module_name}.{name}`", "", f"(not importable here: {exc})", ""]
    if isinstance(target, type):
        return class_section(target, title=f"{module_name}.{name}")
    return [f"### `{module_name}.{name}`", "", "```python", signature(target) + ": ...", "```", "",
            text_of(target), ""]


def commands_section() -> list[str]:
    from plasmid.app import cli

    rules = markdown(inspect.getdoc(cli) or "").split("\n\n")
    contract = next(part for part in rules if COMMAND_GROUP in part)
    return ["## Commands: the `plasmid.commands` entry points", "",
            "A package adds a `plasmid` subcommand with an entry point of group "
            f"`{COMMAND_GROUP}` (not a plugin: it is not loaded by `--plugins` and `plasmid plugins` does not list "
            "it):", "",
            "```toml", f'[project.entry-points."{COMMAND_GROUP}"]', 'my-command = "my_package.cli:main"', "```", "",
            "```python", "def main(argv: list[str]) -> int: ...", "```", "",
            "`plasmid my-command ARGS...` imports `my_package.cli` only then and calls `main` with the arguments "
            "after the command's name; the returned int is the exit status (`plasmid --help` lists the command with "
            "its distribution). Answer `--help`; raise "
            "`plasmid.errors.UsageError` (or another `PlasmidError`) for a mistake the user can fix: plasmid prints "
            "it as one line, `plasmid: error: ...`, and exits 2 (`--debug` adds the traceback).", "",
            "From `plasmid.app.cli`: " + " ".join(contract.split()), ""]


def render() -> str:
    """The page."""
    names = hook_names()
    lines = [
        "# Hooks and provider API",
        "",
        "<!-- Generated from the code; do not edit. Regenerate with:",
        f"     {COMMAND} -->",
        "",
        "Every hook a plugin can implement, every provider protocol, the data they exchange, the command "
        "contract and the testing kit, generated from `plasmid.hookspecs`, `plasmid.protocols`, `plasmid.types` "
        "and `plasmid.testing`. [Writing a plugin](plugins.md) shows them in use; [options.md](options.md) lists "
        "every option.",
        "",
        "Contents: [hooks](#hooks) ([bootstrap](#bootstrap-hooks), [registration](#registration-hooks), "
        "[observer](#observer-hooks)) · [provider protocols](#provider-protocols) · "
        "[capabilities and helpers](#capabilities-and-helper-protocols) · [data types](#data-types) · "
        "[commands](#commands-the-plasmidcommands-entry-points) · [testing kit](#testing-kit)",
        "",
        "## Hooks",
        "",
        text_of(hookspecs),
        "",
        "The hook table (`plasmid.hookspecs`):",
        "",
        "| hook | kind | arguments |",
        "|---|---|---|",
    ]
    for name in names:
        params = ", ".join(f"`{p}`" for p in inspect.signature(getattr(hookspecs, name)).parameters)
        lines.append(f"| [`{name}`](#{name}) | {hook_group(name)} | {params} |")
    lines.append("")
    titles = {"bootstrap": "Bootstrap hooks", "registration": "Registration hooks", "observer": "Observer hooks"}
    intro = {"bootstrap": "Called once per process, before any provider is built; historic. Each implementation is "
                          "called on its own: one that raises has what it declared or set undone, and its plugin is "
                          "skipped with a warning (auto-loaded) or stops the start-up (named in `--plugins`); a "
                          "`PlasmidError` of a defaults or configure hook is the user's error and stops it.",
             "registration": "One per provider family; each receives `register(name, factory, *, default=False)` "
                             "([`Register`](#register)). " + markdown(REGISTRATION),
             "observer": "Start-up is over and the run is going: every implementation is called, in the driver "
                         "process; return values are ignored. Keep them cheap. One that raises is a warning naming "
                         "its plugin, whose observer hooks are then off for the rest of the run; "
                         "`--observer-errors fail` stops the run instead, with a checkpoint of the last step."}
    for group in ("bootstrap", "registration", "observer"):
        lines += [f"## {titles[group]}", "", intro[group], ""]
        for name in names:
            if hook_group(name) == group:
                lines += hook_section(name)
    lines += ["## Provider protocols", "", text_of(protocols), "",
              "| family | hook | flag | protocol | factory |", "|---|---|---|---|---|"]
    for family in FAMILIES:
        lines.append(f"| {family.name} | [`{family.hook}`](#{family.hook}) | `{family.flag}` | "
                     f"[`{family.protocol}`](#{family.protocol.lower()}) | "
                     f"`factory({', '.join(('config', *family.factory_args))})` |")
    lines.append("")
    for family in FAMILIES:
        lines += class_section(protocol_class(family))
    lines += ["## Capabilities and helper protocols", "",
              "Optional capabilities a provider may add (tested with `isinstance`), what a generate function sees "
              "of the run, and the `register` of the registration hooks.", ""]
    for name in EXTRA_PROTOCOLS:
        lines += class_section(getattr(protocols, name))
    lines += ["## Data types", "", text_of(types), ""]
    for name in ("Sample", "SamplingParams", "GenerationOutput", "Status", "Group", "RolloutBatch", "Verdict",
                 "RewardParts", "SyncReport", "LossBatch", "PromptReport"):
        lines += class_section(getattr(types, name))
    lines += commands_section()
    lines += ["## Testing kit", "",
              "`plasmid.testing` builds configurations, registries and providers the way the kernel does, and holds "
              "the contract suites (each family's `...Contract`, see [plugins.md](plugins.md)); "
              "`plasmid.testing.toolcalls` runs a tool in a real multi-turn rollout with a scripted policy; "
              "`build_tiny_model` (the plasmid-torch library, also `plasmid.testing.build_tiny_model`) saves a tiny "
              "model directory for engine, trainer and end-to-end tests (its `config_kwargs` are `tiny_config`'s).", ""]
    for module_name, name in KIT:
        lines += kit_section(module_name, name)
    return "\n".join(line.rstrip() for line in "\n".join(lines).rstrip().split("\n")) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The command: the page on stdout, 0 (it takes no arguments but ``--help``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        print(f"usage: {COMMAND}\n\nPrint the hook and API reference (Markdown).")
        return 0
    if args:
        print(f"plasmid: error: unexpected arguments: {' '.join(args)} (usage: {COMMAND})", file=sys.stderr)
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
