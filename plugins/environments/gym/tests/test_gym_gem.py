"""Episodes of GEM's GuessTheNumber (the real gem-llm package, gymnasium-shaped: ``reset(seed) ->
(obs, info)``, ``step -> (obs, reward, terminated, truncated, info)``) through ``--generate gym``:
tokens, loss mask, log-probs, per-step rewards and the return checked exactly, against GEM replayed
by hand. Runs in the ``environments-gem`` tox env."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import gem
import pytest
from gym_scripted_engine import ScriptedEngine
from plasmid_gym import envs, plugin

from plasmid.testing import build, make_config, run
from plasmid.types import SamplingParams, Status

ENV = "game:GuessTheNumber-v0-easy"  # 1..10, 4 turns
SPEC = f"gem:{ENV}"


def replay(seed, actions):
    """GEM's own episode: the observations before each action, each step's reward, and the last step's
    ``terminated`` and ``truncated``."""
    env = gem.make(ENV)
    observation, _ = env.reset(seed=seed)
    observations, rewards = [], []
    for action in actions:
        observations.append(observation)
        observation, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        if terminated or truncated:
            break
    return observations, rewards, terminated, truncated


def target_of(seed):
    env = gem.make(ENV)
    env.reset(seed=seed)
    return env.game_number


def play(config, actions):
    """One ``--generate gym`` episode whose model turns are ``actions``: the source's sample, the
    engine, the replies' ids and the output."""
    source = build("datasource", "gym", plugin, config=config)
    sample = source.get_groups(1)[0].samples[0]
    tokenizer = source.tokenizer
    eos = tokenizer.eos_token_id
    replies = [tokenizer.encode(action, add_special_tokens=False) + [eos] for action in actions(sample)]
    engine = ScriptedEngine(replies, weight_version=3)
    ctx = SimpleNamespace(tokenizer=tokenizer, engine_for=lambda s: engine, aborting=asyncio.Event())
    out = run(build("generate", "gym", plugin, config=config)(
        ctx, sample, SamplingParams(max_new_tokens=16, stop_token_ids=(eos,))))
    return source, sample, engine, replies, out


def test_the_real_gem_is_wrapped_as_a_gymnasium_shaped_environment():
    env = envs.make(SPEC)
    assert isinstance(env, envs.GymnasiumEpisode) and isinstance(env.env, gem.Env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_one_guess_the_number_episode_token_by_token(tmp_path, tiny_model, gamma):
    config = make_config(plugin, run_dir=tmp_path, model=tiny_model, gym_env=SPEC, gym_gamma=gamma,
                         gym_size=4, gym_eval_size=1)

    def actions(sample):
        target = target_of(sample.label["seed"])
        return [f"\\boxed{{{1 if target != 1 else 2}}}", f"\\boxed{{{target}}}"]

    source, sample, engine, replies, out = play(config, actions)
    tokenizer = source.tokenizer
    observations, rewards, terminated, truncated = replay(sample.label["seed"], actions(sample))
    assert len(observations) == 2 and rewards == [0.0, 1.0] and terminated and not truncated

    prompt = tokenizer.encode(tokenizer.bos_token + observations[0], add_special_tokens=False)
    assert sample.tokens == prompt, "the source's prompt is reset's observation as a user turn"
    assert sample.prompt == [{"role": "user", "content": observations[0]}]
    assert not observations[1].startswith(observations[0]), "GEM's observations do not repeat the history"
    user_turn = tokenizer.encode(tokenizer.bos_token + observations[1], add_special_tokens=False)
    assert engine.prompts == [prompt, prompt + replies[0] + user_turn]
    assert out.tokens == prompt + replies[0] + user_turn + replies[1]
    assert out.response_length == len(replies[0]) + len(user_turn) + len(replies[1])
    assert out.loss_mask == [1] * len(replies[0]) + [0] * len(user_turn) + [1] * len(replies[1])
    assert out.rollout_logprobs == pytest.approx([-0.01 * (i + 1) for i in range(len(replies[0]))]
                                                 + [0.0] * len(user_turn)
                                                 + [-0.02 * (i + 1) for i in range(len(replies[1]))])
    assert out.status == Status.COMPLETED and out.weight_version == 3
    assert out.metadata["gym"]["rewards"] == rewards
    assert out.metadata["gym_return"] == gamma * 1.0
    assert run(build("reward", "gym", plugin, config=config)(out)) == gamma * 1.0


@pytest.mark.timeout(120)
def test_an_episode_out_of_turns_keeps_gems_per_step_rewards(tmp_path, tiny_model):
    """Four wrong guesses: GEM ends the episode (terminated and truncated) with a closeness reward on
    the last step; each step's reward is GEM's, discounted by ``--gym-gamma``."""
    config = make_config(plugin, run_dir=tmp_path, model=tiny_model, gym_env=SPEC, gym_gamma=0.9,
                         gym_size=4, gym_eval_size=1)

    def actions(sample):
        target = target_of(sample.label["seed"])
        return [f"\\boxed{{{n}}}" for n in range(1, 11) if n != target][:4]

    _, sample, engine, replies, out = play(config, actions)
    observations, rewards, terminated, truncated = replay(sample.label["seed"], actions(sample))
    assert len(observations) == 4 and terminated and truncated
    assert rewards[:3] == [0.0, 0.0, 0.0] and 0.0 < rewards[3] < 1.0, "GEM's closeness reward at the end"
    assert len(engine.prompts) == 4
    assert out.status == Status.COMPLETED, "GEM terminated the episode (its truncated flag comes with it)"
    assert out.metadata["gym"]["rewards"] == rewards and out.metadata["gym"]["turns"] == 4
    assert sum(out.loss_mask) == sum(len(reply) for reply in replies), "only the model's tokens are trained"
    assert run(build("reward", "gym", plugin, config=config)(out)) == pytest.approx(0.9**3 * rewards[3])
