"""One episode of TextArena's GuessTheNumber through ``--generate gym``: its tokens, loss mask,
log-probs and reward checked exactly, against the real package replayed by hand."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import textarena
from gym_scripted_engine import ScriptedEngine
from plasmid_gym import plugin

from plasmid.testing import build, make_config, run
from plasmid.types import GenerationOutput, SamplingParams, Status
from plasmid_torch.turns import TURN_REWARDS_KEY, checked_turn_rewards

ENV = "GuessTheNumber-v0-train"


def replay(seed, actions):
    """The observations before each action, whether the episode ended, and TextArena's own rewards."""
    env = textarena.make(ENV)
    env.reset(num_players=1, seed=seed)
    observations, done = [], False
    for action in actions:
        observations.append(env.get_observation()[1])
        done, _ = env.step(action)
        if done:
            break
    return observations, done, env.close()[0], env


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_one_guess_the_number_episode_token_by_token(tmp_path, tiny_model, gamma):
    config = make_config(plugin, run_dir=tmp_path, model=tiny_model, gym_env=f"textarena:{ENV}", gym_gamma=gamma,
                         gym_size=4, gym_eval_size=1)
    source = build("datasource", "gym", plugin, config=config)
    sample = source.get_groups(1)[0].samples[0]
    seed = sample.label["seed"]
    probe = textarena.make(ENV)
    probe.reset(num_players=1, seed=seed)
    target = probe.game_number
    wrong = 1 if target != 1 else 2
    actions = [f"[{wrong}]", f"[{target}]"]
    observations, done, rewards, _ = replay(seed, actions)
    assert done and len(observations) == 2 and rewards == {0: 1}

    tokenizer = source.tokenizer
    eos = tokenizer.eos_token_id
    replies = [tokenizer.encode(action, add_special_tokens=False) + [eos] for action in actions]
    engine = ScriptedEngine(replies)
    generate = build("generate", "gym", plugin, config=config)
    ctx = SimpleNamespace(tokenizer=tokenizer, engine_for=lambda s: engine, aborting=asyncio.Event())
    out = run(generate(ctx, sample, SamplingParams(max_new_tokens=16, stop_token_ids=(eos,))))

    prompt = tokenizer.encode(tokenizer.bos_token + observations[0], add_special_tokens=False)
    assert sample.tokens == prompt, "the source's prompt is the first observation as a user turn"
    new = observations[1][len(observations[0]):]
    assert new and observations[1].startswith(observations[0]), "TextArena repeats the history"
    user_turn = tokenizer.encode(tokenizer.bos_token + new, add_special_tokens=False)
    assert engine.prompts == [prompt, prompt + replies[0] + user_turn]
    assert out.tokens == prompt + replies[0] + user_turn + replies[1]
    assert out.response_length == len(replies[0]) + len(user_turn) + len(replies[1])
    assert out.loss_mask == [1] * len(replies[0]) + [0] * len(user_turn) + [1] * len(replies[1])
    assert out.rollout_logprobs == pytest.approx([-0.01 * (i + 1) for i in range(len(replies[0]))]
                                                 + [0.0] * len(user_turn)
                                                 + [-0.02 * (i + 1) for i in range(len(replies[1]))])
    assert out.status == Status.COMPLETED and out.weight_version == 2
    assert out.metadata["gym"]["rewards"] == [0.0, 1.0]
    assert run(build("reward", "gym", plugin, config=config)(out)) == gamma * rewards[0]
    # each model turn's discounted reward where its tokens start, for a loss with turn credit
    second_turn = len(replies[0]) + len(user_turn)
    assert out.metadata[TURN_REWARDS_KEY] == [[0, 0.0], [second_turn, gamma * 1.0]]
    assert checked_turn_rewards(out.metadata[TURN_REWARDS_KEY], out.response_length, "episode")


@pytest.mark.timeout(120)
def test_an_episode_that_does_not_end_in_max_turns_is_truncated(tmp_path, tiny_model):
    config = make_config(plugin, run_dir=tmp_path, model=tiny_model, gym_env=f"textarena:{ENV}", gym_max_turns=2,
                         gym_size=4, gym_eval_size=1)
    source = build("datasource", "gym", plugin, config=config)
    sample = source.get_groups(1)[0].samples[0]
    probe = textarena.make(ENV)
    probe.reset(num_players=1, seed=sample.label["seed"])
    wrong = [str(n) for n in range(1, 21) if n != probe.game_number][:3]
    eos = source.tokenizer.eos_token_id
    engine = ScriptedEngine([source.tokenizer.encode(f"[{n}]", add_special_tokens=False) + [eos] for n in wrong])
    ctx = SimpleNamespace(tokenizer=source.tokenizer, engine_for=lambda s: engine, aborting=asyncio.Event())
    out = run(build("generate", "gym", plugin, config=config)(ctx, sample, SamplingParams(max_new_tokens=16)))
    assert len(engine.prompts) == 2 and out.status == Status.TRUNCATED
    assert out.metadata["gym"]["rewards"] == [0.0, 0.0] and out.metadata["gym_return"] == 0.0


@pytest.mark.timeout(120)
def test_a_two_player_game_gives_each_player_a_sample_of_the_group(tmp_path, tiny_model):
    game = "TicTacToe-v0-train"
    config = make_config(plugin, run_dir=tmp_path, model=tiny_model, gym_env=f"textarena:{game}", gym_players=2,
                         gym_size=2, gym_eval_size=1)
    source = build("datasource", "gym", plugin, config=config)
    sample = source.get_groups(1)[0].samples[0]
    actions = ["[0]", "[3]", "[1]", "[4]", "[2]"]  # player 0 wins on its third move
    env = textarena.make(game)
    env.reset(num_players=2, seed=sample.label["seed"])
    first_observations = {}
    for action in actions:
        player, observation = env.get_observation()
        first_observations.setdefault(player, observation)
        done, _ = env.step(action)
    assert done
    rewards = env.close()[0]
    eos = source.tokenizer.eos_token_id
    replies = [source.tokenizer.encode(action, add_special_tokens=False) + [eos] for action in actions]
    engine = ScriptedEngine(replies)
    ctx = SimpleNamespace(tokenizer=source.tokenizer, engine_for=lambda s: engine, aborting=asyncio.Event())
    outs = run(build("generate", "gym", plugin, config=config)(ctx, sample, SamplingParams(max_new_tokens=16)))
    assert [out.metadata["gym"]["player"] for out in outs] == [0, 1]
    assert all(out.group_index == sample.group_index for out in outs)
    assert [out.metadata["gym"]["turns"] for out in outs] == [3, 2]
    first, second = outs
    assert first.tokens[:len(engine.prompts[0])] == engine.prompts[0] == sample.tokens
    # each player's sample holds its own moves only, trained on; the other's turns arrive as observations
    assert sum(first.loss_mask) == len(replies[0]) + len(replies[2]) + len(replies[4])
    assert sum(second.loss_mask) == len(replies[1]) + len(replies[3])
    assert engine.prompts[1] == second.tokens[:len(engine.prompts[1])]
    # each sample's prompt messages are its own player's first observation
    assert first.prompt == sample.prompt == [{"role": "user", "content": first_observations[0]}]
    assert second.prompt == [{"role": "user", "content": first_observations[1]}] != first.prompt
    assert second.tokens[:second.prompt_length] == engine.prompts[1]
    reward = build("reward", "gym", plugin, config=config)
    assert [run(reward(out)) for out in outs] == [float(rewards[0]), float(rewards[1])] == [1.0, -1.0]


class AbortingEngine(ScriptedEngine):
    """Answers the first call with its reply cut short, ``ABORTED`` (the driver aborted the step)."""

    async def generate(self, prompt_ids, params):
        out = await super().generate(prompt_ids, params)
        return GenerationOutput(out.token_ids[:1], out.logprobs[:1], Status.ABORTED, out.weight_version)


@pytest.mark.timeout(120)
def test_an_aborted_engine_call_gives_the_prompt_back_aborted_with_an_empty_response(tmp_path, tiny_model):
    config = make_config(plugin, run_dir=tmp_path, model=tiny_model, gym_env=f"textarena:{ENV}", gym_size=4,
                         gym_eval_size=1)
    source = build("datasource", "gym", plugin, config=config)
    sample = source.get_groups(1)[0].samples[0]
    engine = AbortingEngine([source.tokenizer.encode("[7]", add_special_tokens=False)])
    ctx = SimpleNamespace(tokenizer=source.tokenizer, engine_for=lambda s: engine, aborting=asyncio.Event())
    out = run(build("generate", "gym", plugin, config=config)(ctx, sample, SamplingParams(max_new_tokens=16)))
    assert len(engine.prompts) == 1 and out.status == Status.ABORTED
    assert out.tokens == sample.tokens and out.response_length == 0 and out.response == ""
    assert out.loss_mask == [] and out.rollout_logprobs == [], "consistent, as GenerateFn asks: an empty response"
