"""docs/hooks.md is what ``python -m plasmid.app.docs_hooks`` writes: every hook of
``plasmid.hookspecs`` with its signature, caller and result rule, every provider protocol with its
methods, the data types, the ``plasmid.commands`` contract and the testing kit. A hook, protocol
method, field or docstring that changes in the code without the page being regenerated fails here."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import plasmid.hookspecs as hookspecs
from plasmid.app import docs_hooks
from plasmid.app.docs_hooks import COMMAND, hook_names, main, render
from plasmid.families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "hooks.md"


@pytest.fixture(scope="module")
def generated() -> str:
    return render()


def test_docs_hooks_md_is_up_to_date(generated):
    assert PAGE.read_text() == generated, f"docs/hooks.md is out of date; regenerate it: {COMMAND}"


def test_every_hook_has_its_signature_caller_and_result_rule(generated):
    names = hook_names()
    assert len(names) == len([n for n in dir(hookspecs) if n.startswith("plasmid_")]) == 20
    for name in names:
        section = generated.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        assert f"def {name}{inspect.signature(getattr(hookspecs, name))}".replace("'", "") in section, name
        assert "- **Called**: " in section and "- **Result**: collected: " in section, name
    assert "def plasmid_run_end(run_dir: str, metrics: dict[str, float], error: str | None) -> None: ..." in generated
    assert "Historic: a plugin registered after the call" in generated.split("### `plasmid_configure`")[1]


def test_every_family_protocol_and_its_methods_are_there(generated):
    for family in FAMILIES:
        assert f"\n### `{family.protocol}`\n" in generated, family.protocol
        assert f"[`{family.protocol}`](#{family.protocol.lower()})" in generated
    assert "    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationOutput: ..." \
        in generated
    assert "    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ..." in generated
    assert "- `encode`: The ids of `text`. Callers pass `add_special_tokens=False`" in generated
    assert "factory(config, loss)" in generated.split("### `plasmid_trainers`")[1].split("###")[0]


def test_the_data_types_commands_and_testing_kit_are_there(generated):
    assert "    status: Status = Status.PENDING  # PENDING until generated" in generated
    assert "    seed: int | None = None  # a request's seed" in generated
    assert 'my-command = "my_package.cli:main"' in generated and "def main(argv: list[str]) -> int: ..." in generated
    assert "### `plasmid.testing.toolcalls.run_tool_call`" in generated
    assert "### `plasmid.testing.build_tiny_model`\n\n```python\ndef build_tiny_model(directory: " in generated
    assert "Call self as a function" not in generated and ":param " not in generated


def test_build_tiny_model_is_reexported_by_the_testing_kit():
    import plasmid.testing
    from plasmid_torch.tiny import build_tiny_model

    assert plasmid.testing.build_tiny_model is build_tiny_model


def test_a_hook_without_a_caller_note_or_a_field_without_a_note_stops_the_generator(monkeypatch):
    monkeypatch.delitem(docs_hooks.CALLERS, "plasmid_metrics")
    with pytest.raises(KeyError, match="plasmid_metrics has no entry"):
        render()
    monkeypatch.undo()
    monkeypatch.delitem(docs_hooks.FIELD_NOTES["Sample"], "label")
    with pytest.raises(KeyError, match="Sample.label has no note"):
        render()


def test_the_command_prints_the_page_and_refuses_arguments(capsys):
    assert main([]) == 0
    assert capsys.readouterr().out == PAGE.read_text()
    assert main(["--plugins", "x"]) == 2
    assert capsys.readouterr().err.startswith("plasmid: error: unexpected arguments")
