"""The options of --generate multiturn: declared once, checked at start-up, read once when built."""

from __future__ import annotations

import plasmid_multiturn.plugin
import pytest
from plasmid_multiturn.formats import ChatTemplate, Tagged
from plasmid_multiturn.generate import MultiTurn
from plasmid_multiturn.options import MultiTurnOptions

from plasmid.errors import UsageError
from plasmid.testing import build, make_config


def test_the_typed_read_gives_the_declared_defaults():
    options = MultiTurnOptions.of(make_config(plasmid_multiturn.plugin))
    assert options == MultiTurnOptions.defaults()
    assert (options.max_turns, options.max_response_tokens, options.tool_timeout, options.tool_max_output_chars,
            options.tool_call_format) == (4, None, 10.0, 2000, "tagged")


@pytest.mark.parametrize(("bad", "message"), [
    ({"max_turns": 0}, "--max-turns 0: must be >= 1"),
    ({"max_response_tokens": 0}, "--max-response-tokens 0: must be >= 1"),
    ({"tool_timeout": 0.0}, "--tool-timeout 0.0: must be > 0"),
    ({"tool_max_output_chars": 0}, "--tool-max-output-chars 0: must be >= 1"),
    ({"tool_max_images": 0}, "--tool-max-images 0: must be >= 1"),
    ({"tool_max_image_pixels": 0}, "--tool-max-image-pixels 0: must be >= 1"),
    ({"tool_call_format": "xml"}, "--tool-call-format 'xml': choose one of tagged, chat-template, compact, mistral, "
                                  "harmony"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_multiturn.plugin, **bad)
    assert str(raised.value) == message


@pytest.mark.parametrize(("name", "cls"), [("tagged", Tagged), ("chat-template", ChatTemplate)])
def test_the_generate_function_reads_its_options_once_when_built(name, cls):
    config = make_config(plasmid_multiturn.plugin, max_turns=3, max_response_tokens=99, tool_timeout=2.5,
                         tool_max_output_chars=7, tool_call_format=name, mask_offpolicy_in_partial_rollout=True)
    generate = build("generate", "multiturn", plasmid_multiturn.plugin, config=config)
    assert isinstance(generate, MultiTurn) and isinstance(generate.format, cls)
    assert generate.options.budget(16) == 99 and generate.options.tool_timeout == 2.5
    assert generate.mask_offpolicy is True
    assert MultiTurnOptions in MultiTurn.option_classes


# ---------------------------------------------------------------------------------- --tools needs a caller
def test_tools_with_a_generate_function_that_never_calls_them_stops_the_run_before_anything_is_written(
        tmp_path, capsys):
    """The default single-turn generate ignores tools: ``--tools`` with it is one line, exit 2, no run directory."""
    from plasmid.app.cli import main

    run_dir = tmp_path / "run"
    code = main(["train", "--task", "toolcalc", "--tools", "calculator", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2 and not run_dir.exists()
    assert err.count("\n") == 1 and err.startswith("plasmid: error: --tools calculator: --generate single-turn does "
                                                   "not call tools"), err
    assert "--generate multiturn" in err


def test_tools_with_the_multiturn_generate_function_passes_the_start_up_check(tmp_path):
    from plasmid.startup import check_run, start, takes_tools

    startup = start(["--task", "toolcalc", "--generate", "multiturn", "--tools", "calculator",
                     "--run-dir", str(tmp_path / "run")])
    check_run(startup.config, startup.registry)
    assert takes_tools(startup.registry, "multiturn") and not takes_tools(startup.registry, "single-turn")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------ --return-routed-experts needs a carrier
def test_routed_experts_with_a_generate_function_that_drops_them_stops_the_run_before_anything_is_written(
        tmp_path, capsys):
    """multiturn does not copy the engine's routing into its samples: a routing replay would find
    none, so ``--return-routed-experts`` with it is one line, exit 2, no run directory."""
    from plasmid.app.cli import main
    from plasmid.startup import declares, start

    run_dir = tmp_path / "run"
    code = main(["train", "--task", "toolcalc", "--generate", "multiturn", "--return-routed-experts",
                 "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 2 and not run_dir.exists()
    assert err.count("\n") == 1 and err.startswith("plasmid: error: --return-routed-experts: --generate multiturn "
                                                   "does not carry"), err
    startup = start(["--task", "toolcalc", "--run-dir", str(run_dir)])
    assert declares(startup.registry, "single-turn", "carries_routed_experts")
    assert not declares(startup.registry, "multiturn", "carries_routed_experts")
