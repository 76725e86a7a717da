"""The agent options and start-up checks: one-line errors naming the flag, the reward default."""

from __future__ import annotations

from pathlib import Path

import plasmid_agent.plugin
import pytest
from plasmid_agent.options import AgentOptions

from plasmid.errors import UsageError
from plasmid.testing import make_config

AGENTS = Path(__file__).parent / "agents.py"


def test_the_typed_read_gives_the_declared_defaults():
    options = AgentOptions.of(make_config(plasmid_agent.plugin))
    assert options == AgentOptions.defaults()
    assert options.agent is None and options.agent_concurrency == 64 and options.agent_model == "plasmid"
    assert options.agent_errors == "raise"


def test_generate_agent_defaults_the_reward_to_the_agents():
    config = make_config(plasmid_agent.plugin, generate="agent", agent=f"{AGENTS}:answer")
    assert config.option.reward == ["agent"] and config.option.reward_weights == [("agent", 1.0)]


@pytest.mark.parametrize(("options", "message"), [
    ({"generate": "agent"}, "--generate agent needs --agent MODULE:FUNC"),
    ({"generate": "agent", "agent": "no_colon"}, "--agent 'no_colon': give MODULE:FUNC or ./file.py:FUNC"),
    ({"generate": "agent", "agent": "./missing.py:f"}, "--agent './missing.py:f': no file ./missing.py"),
    ({"generate": "agent", "agent": "no_such_module_xyz:f"}, "no module 'no_such_module_xyz'"),
    ({"generate": "agent", "agent": f"{AGENTS}:nothing"}, "has no attribute 'nothing'"),
    ({"generate": "agent", "agent_concurrency": 0, "agent": f"{AGENTS}:answer"}, "--agent-concurrency"),
    ({"generate": "agent", "agent_max_calls": 0, "agent": f"{AGENTS}:answer"}, "--agent-max-calls"),
    ({"generate": "agent", "agent_max_images": 0, "agent": f"{AGENTS}:answer"}, "--agent-max-images 0: must be >= 1"),
    ({"generate": "agent", "agent_max_image_pixels": 0, "agent": f"{AGENTS}:answer"},
     "--agent-max-image-pixels 0: must be >= 1"),
    ({"generate": "agent", "agent_image_paths": "yes", "agent": f"{AGENTS}:answer"},
     "--agent-image-paths: expected true or false, got 'yes'"),
    ({"generate": "agent", "agent_errors": "ignore", "agent": f"{AGENTS}:answer"},
     "--agent-errors 'ignore': choose one of raise, zero"),
    ({"reward": ["agent"]}, "--reward agent scores what the agent function returned, so it needs --generate agent"),
])
def test_bad_agent_settings_are_one_line_usage_errors(options, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(".", r"\.")) as raised:
        make_config(plasmid_agent.plugin, **options)
    assert "\n" not in str(raised.value)


def test_an_agent_file_that_fails_to_import_is_named(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('no openai here')\n")
    with pytest.raises(UsageError, match=r"importing .*broken.py failed: ImportError: no openai here"):
        make_config(plasmid_agent.plugin, generate="agent", agent=f"{broken}:agent")


def test_a_relative_agent_file_is_made_absolute_for_processes_elsewhere(tmp_path, monkeypatch):
    """Ray actors run configure again in another working directory: they must find the file."""
    monkeypatch.chdir(AGENTS.parent)
    config = make_config(plasmid_agent.plugin, generate="agent", agent="./agents.py:answer")
    assert config.option.agent == f"{AGENTS}:answer"
    monkeypatch.chdir(tmp_path)
    assert AgentOptions.of(make_config(plasmid_agent.plugin, generate="agent",
                                       agent=config.option.agent)).agent == f"{AGENTS}:answer"
