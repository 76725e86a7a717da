"""The contract every tool keeps; a tool plugin's tests subclass :class:`ToolContract`.

::

    from plasmid.testing import ToolContract
    import my_package.plugin

    class TestCalculator(ToolContract):
        plugin = my_package.plugin                        # the module with the hookimpls
        provider = "calculator"                           # the name it registers
        config_options = {}                               # options the factory needs (Python names)
        valid_arguments = [{"expression": "2 * (3 + 4)"}]  # calls that must succeed
        invalid_arguments = [{"expression": "2 *"}, {}]   # calls that must fail

The suite builds the tool the way the kernel does (``factory(config)`` from
``plasmid.testing.make_config(plugin, **config_options)``) and checks what the multi-turn
generate function relies on (:class:`plasmid.protocols.Tool`):

- ``name`` is a function name a model can call (letters, digits, ``_`` and ``-``, at most 64, as
  in OpenAI function calling); ``description`` a non-empty string; ``parameters`` a JSON schema
  of an object (``{"type": "object", "properties": {...}}``, ``required`` naming properties), and
  all three are JSON-serialisable (they are rendered into prompts and chat templates);
- a call is awaitable and, with each of ``valid_arguments``, returns an answer: a ``str``, or a
  list of OpenAI content parts (``{"type": "text", "text": str}``, ``{"type": "image_url",
  "image_url": {"url": str}}``) for a tool that shows the policy images;
- each of ``invalid_arguments`` raises :class:`plasmid.protocols.ToolError` or another exception
  with a message (the generate loop shows it to the model); it never returns;
- a call leaves its ``arguments`` and the sample (prompt, tokens, label, metadata) unchanged;
- concurrent calls give what sequential calls give (no per-call state on the tool); set
  ``deterministic = False`` for a tool whose answer may differ twice, which then only has to
  answer (a ``str`` or content parts) under concurrency.

Every call is bounded by ``call_timeout`` seconds. ``invalid_arguments`` defaults to one call per
required parameter with that parameter left out (nothing, when none is required); give calls
that exercise the tool's checks.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

from plasmid.config import Config
from plasmid.protocols import Tool, ToolError
from plasmid.testing import build, make_config, make_registry, run
from plasmid.types import Sample, Status

#: A callable function name in OpenAI function calling (and most chat templates).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_answer(answer: Any) -> bool:
    """Whether ``answer`` is what a tool may answer (:class:`plasmid.protocols.Tool`): a ``str``, or a
    non-empty list of ``{"type": "text", "text": str}`` and ``{"type": "image_url", "image_url":
    {"url": str}}`` parts."""
    if isinstance(answer, str):
        return True
    return isinstance(answer, list) and bool(answer) and all(
        isinstance(part, dict) and (part.get("type") == "text" and isinstance(part.get("text"), str)
                                    or part.get("type") == "image_url" and isinstance(part.get("image_url"), dict)
                                    and isinstance(part["image_url"].get("url"), str)) for part in answer)


def make_call_sample(label: Any = None, metadata: dict[str, Any] | None = None) -> Sample:
    """The sample a tool is called for: a prompt in the middle of its rollout (stand-in ids)."""
    return Sample(prompt="What is 2 * (3 + 4)?", tokens=[1, 40, 41, 42, 43], response="", response_length=0,
                  label=label, metadata=dict(metadata or {}), status=Status.PENDING, index=0, group_index=0)


def _snapshot(sample: Sample) -> tuple[Any, ...]:
    return copy.deepcopy((sample.prompt, sample.tokens, sample.response, sample.label, sample.metadata))


class ToolContract:
    """Subclass with ``plugin``, ``provider`` and ``valid_arguments``; see the module docstring."""

    #: The module (or object) with the plugin's hookimpls.
    plugin: ClassVar[Any] = None
    #: The name the plugin registers in ``plasmid_tools``.
    provider: ClassVar[str] = ""
    #: Options for ``make_config`` (Python names).
    config_options: ClassVar[dict[str, Any]] = {}
    #: Arguments of calls that must succeed (return a ``str`` or content parts).
    valid_arguments: ClassVar[list[dict[str, Any]]] = []
    #: Arguments of calls that must fail (raise); ``None``: derived from the schema's ``required``.
    invalid_arguments: ClassVar[list[dict[str, Any]] | None] = None
    #: ``label`` and ``metadata`` of the sample the calls are made for.
    label: ClassVar[Any] = None
    metadata: ClassVar[dict[str, Any]] = {}
    #: Whether one call always gets one answer (False for tools that sample or read a clock).
    deterministic: ClassVar[bool] = True
    #: How many copies of the valid calls the concurrency check runs at once.
    concurrency: ClassVar[int] = 8
    #: Seconds any one call may take.
    call_timeout: ClassVar[float] = 30.0

    # ------------------------------------------------------------------------------ fixtures
    @pytest.fixture
    def config(self, tmp_path: Path) -> Config:
        """The configuration the tool is built from."""
        return make_config(self.plugin, run_dir=tmp_path / "run", **self.config_options)

    @pytest.fixture
    def tool(self, config: Config) -> Any:
        """The tool, built by its registered factory."""
        return build("tool", self.provider, self.plugin, config=config)

    # ------------------------------------------------------------------------------ helpers
    def where(self) -> str:
        return f"tool '{self.provider}'"

    def bad_calls(self, tool: Any) -> list[dict[str, Any]]:
        """``invalid_arguments``, or one call per required parameter with it left out."""
        if self.invalid_arguments is not None:
            return list(self.invalid_arguments)
        required = list(tool.parameters.get("required", []))
        complete = self.valid_arguments[0] if self.valid_arguments else {}
        return [{key: value for key, value in complete.items() if key != name} for name in required]

    async def call(self, tool: Any, arguments: dict[str, Any], sample: Sample) -> Any:
        """``await tool(arguments, sample)``, which must be awaitable, within ``call_timeout``."""
        pending = tool(arguments, sample)
        assert inspect.isawaitable(pending), (
            f"{self.where()} returned {type(pending).__name__} without awaiting; it must be "
            f"`async def __call__(self, arguments, sample)`"
        )
        try:
            return await asyncio.wait_for(pending, self.call_timeout)
        except TimeoutError:
            raise AssertionError(f"{self.where()} took more than {self.call_timeout} s on {arguments!r}") from None

    # ------------------------------------------------------------------------------ the contract
    def test_provider_is_registered_under_plasmid_tools(self) -> None:
        assert self.plugin is not None and self.provider, "set the class attributes `plugin` and `provider`"
        registry = make_registry(self.plugin)
        assert self.provider in registry.names("tool"), (
            f"{self.where()} is not registered by plasmid_tools of {self.plugin!r}; "
            f"registered tools: {registry.names('tool')}"
        )
        assert self.valid_arguments, "set `valid_arguments`: at least one call that must succeed"

    def test_factory_builds_a_tool(self, tool: Any) -> None:
        assert isinstance(tool, Tool) and callable(tool), (
            f"the factory of {self.where()} returned {type(tool).__name__}; a tool has name, description, "
            f"parameters and async __call__(arguments, sample)"
        )

    def test_name_description_and_parameters_are_well_formed(self, tool: Any) -> None:
        where = self.where()
        assert isinstance(tool.name, str) and TOOL_NAME.match(tool.name), (
            f"{where} has the name {tool.name!r}; a tool name is 1-64 letters, digits, '_' or '-'"
        )
        assert isinstance(tool.description, str) and tool.description.strip(), (
            f"{where} has the description {tool.description!r}; give one line the model is shown"
        )
        parameters = tool.parameters
        assert isinstance(parameters, dict), f"{where}: parameters is {type(parameters).__name__}, not a dict"
        assert parameters.get("type") == "object", (
            f"{where}: parameters must be a JSON schema of an object ({{'type': 'object', 'properties': ...}}), "
            f"got type {parameters.get('type')!r}"
        )
        properties = parameters.get("properties", {})
        assert isinstance(properties, dict), f"{where}: parameters['properties'] is not a dict"
        for key, schema in properties.items():
            assert isinstance(key, str) and isinstance(schema, dict), (
                f"{where}: property {key!r} needs a schema dict, got {schema!r}"
            )
        required = parameters.get("required", [])
        assert isinstance(required, list) and all(isinstance(name, str) for name in required), (
            f"{where}: parameters['required'] must be a list of property names, got {required!r}"
        )
        unknown = [name for name in required if name not in properties]
        assert not unknown, f"{where}: parameters['required'] names {unknown}, which are not properties"
        try:
            json.dumps({"name": tool.name, "description": tool.description, "parameters": parameters})
        except (TypeError, ValueError) as exc:
            raise AssertionError(f"{where}: name, description and parameters must be JSON-serialisable: {exc}") from exc

    def test_a_call_with_valid_arguments_returns_a_string(self, tool: Any) -> None:
        for arguments in self.valid_arguments:
            answer = run(self.call(tool, copy.deepcopy(arguments), make_call_sample(self.label, self.metadata)))
            assert is_answer(answer), (
                f"{self.where()} answered {arguments!r} with {type(answer).__name__} {answer!r}; a tool returns "
                f"the text shown to the model, a str, or a list of text and image_url content parts"
            )

    def test_a_call_with_bad_arguments_raises_a_clear_error(self, tool: Any) -> None:
        for arguments in self.bad_calls(tool):
            try:
                answer = run(self.call(tool, copy.deepcopy(arguments), make_call_sample(self.label, self.metadata)))
            except ToolError as exc:
                assert str(exc).strip(), f"{self.where()} raised a ToolError without a message on {arguments!r}"
                continue
            except AssertionError:
                raise
            except Exception as exc:  # noqa: BLE001 - a clear exception: the loop shows type and message
                assert str(exc).strip(), (
                    f"{self.where()} raised {type(exc).__name__} without a message on {arguments!r}; raise "
                    f"ToolError('what is wrong') so that the model can be told"
                )
                continue
            raise AssertionError(f"{self.where()} returned {answer!r} for the bad arguments {arguments!r}; raise "
                                 f"plasmid.ToolError('what is wrong') instead")

    def test_a_call_changes_neither_its_arguments_nor_the_sample(self, tool: Any) -> None:
        for arguments in [*self.valid_arguments, *self.bad_calls(tool)]:
            given, sample = copy.deepcopy(arguments), make_call_sample(self.label, self.metadata)
            before = _snapshot(sample)
            try:
                run(self.call(tool, given, sample))
            except AssertionError:
                raise
            except Exception:  # noqa: BLE001 - failing is allowed here; only the inputs are checked
                pass
            assert given == arguments, f"{self.where()} changed its arguments {arguments!r} into {given!r}"
            assert _snapshot(sample) == before, (
                f"{self.where()} changed the sample it was called for; tools read label and metadata, never write"
            )

    def test_concurrent_calls_give_what_sequential_calls_give(self, tool: Any) -> None:
        calls = [copy.deepcopy(arguments) for _ in range(self.concurrency) for arguments in self.valid_arguments]

        async def sequential_then_concurrent() -> tuple[list[Any], list[Any]]:
            one_by_one = [await self.call(tool, copy.deepcopy(a), make_call_sample(self.label, self.metadata))
                          for a in calls]
            together = await asyncio.gather(*(self.call(tool, copy.deepcopy(a),
                                                        make_call_sample(self.label, self.metadata)) for a in calls))
            return one_by_one, list(together)

        one_by_one, together = run(sequential_then_concurrent())
        assert all(is_answer(answer) for answer in together), (
            f"{self.where()} answered concurrent calls with something other than a str or content parts: {together!r}"
        )
        if self.deterministic:
            assert together == one_by_one, (
                f"{self.where()} answered the same calls differently when they ran concurrently; it must keep no "
                f"per-call state on the tool (or set deterministic = False)"
            )
