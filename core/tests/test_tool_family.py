"""The tool family: ``--tools`` parsed and checked at start-up, the run's tools built once into
``ctx.tools``, and the ToolContract (a scripted tool passes it; broken tools fail it)."""

from __future__ import annotations

import asyncio

import pytest

from plasmid import hookimpl
from plasmid.errors import PlasmidError, PluginError, ProviderError, UsageError
from plasmid.protocols import ToolError
from plasmid.session import build_tools
from plasmid.startup import tool_names
from plasmid.testing import ToolContract, make_config, make_registry


class Adder:
    """A scripted tool: adds two integers."""

    name = "add"
    description = "Add two integers."
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                  "required": ["a", "b"]}

    def __init__(self, config):
        self.config = config

    async def __call__(self, arguments, sample):
        try:
            a, b = arguments["a"], arguments["b"]
        except KeyError as missing:
            raise ToolError(f"missing argument {missing}") from None
        if not isinstance(a, int) or not isinstance(b, int):
            raise ToolError("a and b must be integers")
        await asyncio.sleep(0)
        return str(a + b)


class Echo:
    name = "echo"
    description = "Repeat the text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def __init__(self, config):
        pass

    async def __call__(self, arguments, sample):
        if not isinstance(arguments.get("text"), str):
            raise ToolError("text must be a string")
        return arguments["text"]


class Picture:
    """Answers with content parts: a caption and an image (a tool that shows a vision-language policy one)."""

    name = "picture"
    description = "A one-pixel picture of the colour."
    parameters = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}

    def __init__(self, config):
        pass

    async def __call__(self, arguments, sample):
        if not isinstance(arguments.get("colour"), str):
            raise ToolError("colour must be a string")
        return [{"type": "text", "text": arguments["colour"]},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]


class Tools:
    @hookimpl
    def plasmid_tools(self, register):
        register("add", Adder)
        register("echo", Echo)
        register("picture", Picture)
        register("also-add", Adder)
        register("not-a-tool", lambda config: object())
        register("exploding", self.explode)

    @staticmethod
    def explode(config):
        raise RuntimeError("no licence")


TOOLS = Tools()


class TestScriptedToolKeepsTheContract(ToolContract):
    plugin = TOOLS
    provider = "add"
    valid_arguments = [{"a": 2, "b": 3}, {"a": -1, "b": 1}]
    invalid_arguments = [{"a": 2}, {"a": "2", "b": 3}, {}]


class TestSchemaDerivedBadCalls(ToolContract):
    plugin = TOOLS
    provider = "echo"
    valid_arguments = [{"text": "hello"}]


class TestAToolAnsweringContentPartsKeepsTheContract(ToolContract):
    plugin = TOOLS
    provider = "picture"
    valid_arguments = [{"colour": "red"}]


# ---------------------------------------------------------------------------------- the contract can fail
class Stateful(Adder):
    """Keeps per-call state on the tool: concurrent answers differ from sequential ones."""

    name = "stateful"

    def __init__(self, config):
        self.last = ""

    async def __call__(self, arguments, sample):
        self.last = str(arguments["a"])
        await asyncio.sleep(0.001)
        return self.last


class Lenient(Adder):
    """Answers bad arguments instead of raising."""

    name = "lenient"

    async def __call__(self, arguments, sample):
        return str(arguments.get("a", 0) + arguments.get("b", 0))


class BadSchema(Adder):
    name = "bad schema"
    parameters = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}


class Sync(Adder):
    name = "sync"

    def __call__(self, arguments, sample):
        return "5"


class BadParts(Adder):
    """Answers a list whose part is neither text nor an image_url."""

    name = "bad-parts"

    async def __call__(self, arguments, sample):
        return [{"type": "image"}]


class Broken:
    @hookimpl
    def plasmid_tools(self, register):
        for cls in (Stateful, Lenient, BadSchema, Sync, BadParts):
            register(cls.name.replace(" ", "-"), cls)


def contract_for(provider, **attributes):
    return type("Contract", (ToolContract,), {"plugin": Broken(), "provider": provider,
                                              "valid_arguments": [{"a": 1, "b": 2}, {"a": 3, "b": 4}],
                                              **attributes})()


@pytest.mark.parametrize(("provider", "check", "message"), [
    ("stateful", "test_concurrent_calls_give_what_sequential_calls_give", "differently when they ran concurrently"),
    ("lenient", "test_a_call_with_bad_arguments_raises_a_clear_error", "for the bad arguments"),
    ("bad-schema", "test_name_description_and_parameters_are_well_formed", "a tool name is"),
    ("sync", "test_a_call_with_valid_arguments_returns_a_string", "without awaiting"),
    ("bad-parts", "test_a_call_with_valid_arguments_returns_a_string", "a list of text and image_url content parts"),
])
def test_the_contract_fails_a_tool_that_breaks_it(provider, check, message, tmp_path):
    contract = contract_for(provider, invalid_arguments=[{"a": 1}])
    config = make_config(contract.plugin, run_dir=tmp_path)
    from plasmid.testing import build

    tool = build("tool", provider, contract.plugin, config=config)
    with pytest.raises(AssertionError, match=message):
        getattr(contract, check)(tool)


def test_the_contract_fails_a_schema_whose_required_names_no_property(tmp_path):
    contract = contract_for("bad-schema")
    tool = BadSchema(None)
    tool.name = "fine"
    with pytest.raises(AssertionError, match=r"required'\] names \['b'\]"):
        contract.test_name_description_and_parameters_are_well_formed(tool)


def test_the_family_table_names_the_contract_and_plasmid_testing_exports_it():
    from plasmid.families import family
    from plasmid.testing.contracts.tool import ToolContract as Direct

    assert family("tool").contract == "plasmid.testing.contracts.tool:ToolContract"
    assert ToolContract is Direct


# ---------------------------------------------------------------------------------- --tools
@pytest.mark.parametrize(("given", "names"), [
    ([], []),
    (["add"], ["add"]),
    (["add,echo"], ["add", "echo"]),
    (["add", "echo"], ["add", "echo"]),
    ([" echo , add "], ["echo", "add"]),
])
def test_tools_accepts_repeated_and_comma_separated_names_in_order(given, names):
    assert tool_names(given) == names
    assert make_config(TOOLS, tools=given).option.tools == names


@pytest.mark.parametrize(("given", "message"), [
    (["add,add"], "--tools: tool 'add' is given twice; name each tool once"),
    (["add", "echo,add"], "--tools: tool 'add' is given twice; name each tool once"),
    (["add,"], "--tools 'add,': an empty tool name (expected NAME or NAME,NAME,...)"),
])
def test_a_repeated_or_empty_tool_name_is_a_one_line_usage_error(given, message):
    with pytest.raises(UsageError) as raised:
        make_config(TOOLS, tools=given)
    assert str(raised.value) == message


def test_an_unknown_tool_is_a_one_line_error_at_start_up_naming_the_known_ones():
    with pytest.raises(PluginError) as raised:
        make_config(TOOLS, tools=["add,calculater"])
    text = str(raised.value)
    assert "\n" not in text and "unknown tool 'calculater' (--tools)" in text and "add" in text


def test_the_run_builds_each_tool_once_keyed_by_the_name_the_model_calls(tmp_path):
    config = make_config(TOOLS, run_dir=tmp_path, tools=["echo,add"])
    tools = build_tools(config, make_registry(TOOLS))
    assert list(tools) == ["echo", "add"]
    assert isinstance(tools["add"], Adder) and tools["add"].config is config
    assert build_tools(make_config(TOOLS, run_dir=tmp_path), make_registry(TOOLS)) == {}


@pytest.mark.parametrize(("given", "error", "message"), [
    (["add,also-add"], UsageError, "tool 'also-add' is called 'add' by the model, as is another tool"),
    (["not-a-tool"], ProviderError, "tool 'not-a-tool' from plugin 'Tools' (distribution (test) ) built object, "
                                    "which is no plasmid Tool"),
    (["exploding"], ProviderError, "tool 'exploding' from plugin 'Tools' (distribution (test) ) failed to "
                                   "start: RuntimeError: no licence"),
])
def test_a_tool_that_cannot_be_built_is_a_one_line_error_naming_it(given, error, message, tmp_path):
    config = make_config(TOOLS, run_dir=tmp_path, tools=given)
    with pytest.raises(error) as raised:
        build_tools(config, make_registry(TOOLS))
    assert isinstance(raised.value, PlasmidError) and "\n" not in str(raised.value)
    assert message in str(raised.value)


def test_the_rollout_context_carries_the_tools(tmp_path):
    from plasmid.context import RolloutContext

    assert RolloutContext.__dataclass_fields__["tools"].default_factory() == {}
