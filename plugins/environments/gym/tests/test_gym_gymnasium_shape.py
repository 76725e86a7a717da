"""A gymnasium-shaped environment (GEM's ``reset(seed) -> (obs, info)``, ``step -> (obs, reward,
terminated, truncated, info)``) through ``--generate gym``: per-step rewards, discounting, truncation.

Test support: ``countup`` below is a stand-in written here, for what GEM's games do not show (a
truncation without termination, a reward on every step); ``test_gym_gem.py`` runs the real GEM (the
``environments-gem`` tox env) and the TextArena tests the real TextArena through the same loop.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from types import SimpleNamespace

import pytest
from gym_scripted_engine import ScriptedEngine
from plasmid_gym import envs, plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config, run
from plasmid.types import SamplingParams, Status

#: A gymnasium-shaped text env: say the next number; +1 for right, -0.5 for wrong; 3 steps, then truncated.
COUNTUP = '''
class CountUp:
    def reset(self, seed=None, options=None):
        self.n, self.steps = seed % 7, 0
        return f"count from {self.n}", {}

    def step(self, action):
        self.steps += 1
        right = action.strip() == str(self.n + 1)
        self.n += 1
        terminated = self.n >= 20
        return f"now {self.n}", 1.0 if right else -0.5, terminated, self.steps >= 3 and not terminated, {}


def make(env_id):
    assert env_id == "CountUp-v0"
    return CountUp()
'''


@pytest.fixture
def countup(tmp_path, monkeypatch):
    (tmp_path / "countup.py").write_text(textwrap.dedent(COUNTUP))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "countup:CountUp-v0"
    sys.modules.pop("countup", None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_each_step_reward_counts_and_a_truncated_episode_is_truncated(tmp_path, tiny_model, countup, gamma):
    config = make_config(plugin, run_dir=tmp_path / "run", model=tiny_model, gym_env=countup, gym_gamma=gamma,
                         gym_size=4, gym_eval_size=1)
    source = build("datasource", "gym", plugin, config=config)
    sample = source.get_groups(1)[0].samples[0]
    start = sample.label["seed"] % 7
    tokenizer = source.tokenizer
    eos = tokenizer.eos_token_id
    actions = [str(start + 1), "x", str(start + 3)]  # right, wrong, right; then the env truncates
    replies = [tokenizer.encode(action, add_special_tokens=False) + [eos] for action in actions]
    engine = ScriptedEngine(replies, weight_version=1)
    ctx = SimpleNamespace(tokenizer=tokenizer, engine_for=lambda s: engine, aborting=asyncio.Event())
    out = run(build("generate", "gym", plugin, config=config)(ctx, sample,
                                                             SamplingParams(max_new_tokens=16, stop_token_ids=(eos,))))
    assert len(engine.prompts) == 3
    assert engine.prompts[0] == tokenizer.encode(tokenizer.bos_token + f"count from {start}",
                                                 add_special_tokens=False), "the prompt is reset's observation"
    assert out.metadata["gym"]["rewards"] == [1.0, -0.5, 1.0]
    assert out.status == Status.TRUNCATED, "gymnasium's truncated ends the episode as truncated"
    assert out.metadata["gym_return"] == pytest.approx(1.0 - 0.5 * gamma + gamma**2)
    assert run(build("reward", "gym", plugin, config=config)(out)) == pytest.approx(1.0 - 0.5 * gamma + gamma**2)
    assert sum(out.loss_mask) == sum(len(reply) for reply in replies), "only the model's tokens are trained"


def test_a_gymnasium_shaped_environment_has_one_player(countup):
    env = envs.make(countup)
    assert isinstance(env, envs.GymnasiumEpisode)
    with pytest.raises(UsageError, match="--gym-players 2: a gymnasium-shaped environment"):
        envs.reset(env, 2, 0)
