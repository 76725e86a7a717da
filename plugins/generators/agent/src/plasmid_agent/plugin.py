"""Hook implementations of plasmid-agent."""

from __future__ import annotations

from collections.abc import Callable

from plasmid import hookimpl
from plasmid.config import Config, OptionParser
from plasmid.errors import UsageError
from plasmid_agent.options import AgentOptions
from plasmid_serving.parsers.options import ParserOptions


@hookimpl
def plasmid_addoption(parser: OptionParser) -> None:
    parser.add_options(AgentOptions)
    parser.add_options(ParserOptions)  # --tool-parser, --reasoning-parser (shared with multiturn)


@hookimpl
def plasmid_defaults(config: Config) -> None:
    """With ``--generate agent`` and no ``--reward``, the reward is the agent's (``--reward agent``)."""
    if config.option.generate == "agent" and not config.is_given("reward"):
        config.option.reward = ["agent"]
        config.option.reward_weights = [("agent", 1.0)]


@hookimpl
def plasmid_configure(config: Config) -> None:
    """``--generate agent`` needs ``--agent``, which is loaded now (a bad one stops the run before
    anything is built; a file path is made absolute, for processes with another working directory);
    a given ``--reward agent`` needs ``--generate agent``."""
    agent = AgentOptions.of(config).agent
    generate = config.option.generate
    rewards = [name for name, _ in getattr(config.option, "reward_weights", None) or []]
    if generate == "agent":
        if agent is None:
            raise UsageError("--generate agent needs --agent MODULE:FUNC (or ./file.py:FUNC): the agent function "
                             "to run for each prompt")
        from plasmid_agent.loader import absolute_spec, load_agent

        load_agent(agent)
        config.option.agent = absolute_spec(agent)  # processes started elsewhere (Ray actors) find the file
    if "agent" in rewards and generate != "agent" and config.is_given("reward"):
        raise UsageError("--reward agent scores what the agent function returned, so it needs --generate agent "
                         "--agent MODULE:FUNC")


@hookimpl
def plasmid_generate_fns(register: Callable[..., None]) -> None:
    register("agent", "plasmid_agent.generate:AgentGenerate")


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("agent", "plasmid_agent.reward:AgentReward")
