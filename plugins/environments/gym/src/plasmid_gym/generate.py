"""``--generate gym``: one episode of ``--gym-env`` per prompt sample, token in, token out.

Each player's conversation is its own token sequence, built by prefix-extension and never
re-tokenised: its first observation, rendered with the tokenizer's chat template as one user
message (generation prompt added), is the prompt; each model turn appends the ids the engine
generated (``loss_mask`` 1, the engine's log-probs); each later observation is appended as a user
message: the chat template renders the conversation again, the rendering must start with the text
so far (the previous rendering plus the model's turn as generated), and only the rest is encoded
(``loss_mask`` 0, log-prob 0.0). An observation that extends the player's previous one (TextArena
repeats the whole history) contributes only its new text. The model's turn, decoded without special
tokens, is the action given to ``env.step``.

The episode ends when the environment says so (``COMPLETED``), after ``--gym-max-turns`` model turns
or when a turn would not fit ``--max-new-tokens`` (``TRUNCATED``), or when the chat template would
rewrite the history (``COMPLETED``, the reason in ``metadata["gym"]["mismatch"]``); a
gymnasium-shaped environment that truncates the episode ends it ``TRUNCATED``. Each player's step
gets the reward ``env.step`` gave it (0 in TextArena's shape), the rewards of ``env.close()`` are
added to its last step, and its return is ``sum gamma^t r_t`` (``--gym-gamma``), kept in
``metadata["gym_return"]`` for the ``gym`` reward. Each step's term ``gamma^t r_t`` is also kept as
that model turn's reward, at the response offset where the turn's tokens start, in
``metadata["turn_rewards"]`` (:data:`plasmid_torch.turns.TURN_REWARDS_KEY`; they add up to the
return), for a loss with turn credit (plasmid-grpo's ``--turn-credit``).
With several players (``--gym-players``), each player that acted is a sample of its own, all in
the prompt's group (``metadata["gym"]["player"]``), its ``prompt`` its own first observation (one user
message), not player 0's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.protocols import RolloutView
from plasmid.types import Sample, SamplingParams, Status
from plasmid_gym import envs
from plasmid_gym.options import GymOptions
from plasmid_torch.turns import TURN_REWARDS_KEY

RETURN_KEY, STATE_KEY = "gym_return", "gym"


def render(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))


@dataclass
class Player:
    """One player's conversation so far."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    prompt: list[int] = field(default_factory=list)
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    observation: str = ""
    rewards: list[float] = field(default_factory=list)
    #: where each model turn's tokens start in ``response``
    turn_starts: list[int] = field(default_factory=list)


def turn_rewards(player: Player, gamma: float) -> list[list[float]]:
    """``[[offset, gamma^t r_t], ...]``: each model turn's share of the player's return, at the
    response offset where its tokens start. A turn that starts where the one before it does, or
    at the end of the response (it produced no token), is merged into the one before it, so the
    offsets strictly increase and the shares still add up to the return."""
    merged: list[list[float]] = []
    for step, (start, reward) in enumerate(zip(player.turn_starts, player.rewards, strict=True)):
        term = gamma**step * reward
        start = max(min(start, len(player.response) - 1), 0)
        if merged and merged[-1][0] >= start:
            merged[-1][1] += term
        else:
            merged.append([start, term])
    return merged


class GymGenerate:
    """Provider ``gym`` of ``plasmid_generate_fns``; see the module docstring."""

    option_classes: ClassVar[tuple[type[Options], ...]] = (GymOptions,)

    def __init__(self, config: Config) -> None:
        self.options = GymOptions.of(config)
        if self.options.gym_env is None:
            from plasmid.errors import UsageError

            raise UsageError("--generate gym needs --gym-env PACKAGE:ENV_ID")

    async def __call__(self, ctx: RolloutView, sample: Sample, params: SamplingParams) -> Sample | list[Sample]:
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            return sample
        options, tokenizer = self.options, ctx.tokenizer
        assert options.gym_env is not None
        env = envs.make(options.gym_env)
        envs.reset(env, options.gym_players, int(sample.label["seed"]))
        players: dict[int, Player] = {}
        status, mismatch, turns, weight_version = Status.COMPLETED, "", 0, sample.weight_version
        while True:
            pid, observation = envs.observe(env)
            player = players.setdefault(pid, Player())
            if not player.messages:
                player.messages = [{"role": "user", "content": observation}]
                player.text = render(tokenizer, player.messages)
                player.prompt = list(tokenizer.encode(player.text, add_special_tokens=False))
            else:
                messages = [*player.messages, {"role": "user", "content": envs.new_text(player.observation,
                                                                                         observation)}]
                rendered = render(tokenizer, messages)
                if not rendered.startswith(player.text):
                    mismatch = f"the chat template renders player {pid}'s history differently from its tokens"
                    break
                appended = list(tokenizer.encode(rendered[len(player.text):], add_special_tokens=False))
                player.response += appended
                player.mask += [0] * len(appended)
                player.logprobs += [0.0] * len(appended)
                player.messages, player.text = messages, rendered
            player.observation = observation
            if turns >= options.gym_max_turns:
                status = Status.TRUNCATED
                break
            output = await ctx.engine_for(sample).generate(player.prompt + player.response, params)
            weight_version = output.weight_version
            ids = list(output.token_ids)
            player.turn_starts.append(len(player.response))
            player.response += ids
            player.mask += [1] * len(ids)
            player.logprobs += list(output.logprobs)
            turns += 1
            if output.status == Status.ABORTED:
                return replace(sample, tokens=sample.prompt_tokens, response="", response_length=0, loss_mask=[],
                               rollout_logprobs=[], status=Status.ABORTED)
            action = tokenizer.decode(ids, skip_special_tokens=True)
            player.messages.append({"role": "assistant", "content": action})
            player.text += tokenizer.decode(ids, skip_special_tokens=False)
            stepped = envs.step(env, action)
            player.rewards.append(stepped.reward)
            if stepped.done:
                if stepped.truncated:
                    status = Status.TRUNCATED
                break
            if output.status == Status.TRUNCATED:
                status = Status.TRUNCATED
                break
        finals = envs.final_rewards(env, options.gym_players)
        samples = []
        for pid in sorted(players):
            player = players[pid]
            if not player.rewards:
                continue  # never acted: nothing to train on
            player.rewards[-1] += finals.get(pid, 0.0)
            samples.append(replace(
                sample, prompt=player.messages[:1], tokens=player.prompt + player.response,
                response_length=len(player.response),
                response=tokenizer.decode(player.response, skip_special_tokens=True), loss_mask=player.mask,
                rollout_logprobs=player.logprobs, status=status, weight_version=weight_version,
                metadata={**sample.metadata, RETURN_KEY: envs.discounted(player.rewards, options.gym_gamma),
                          TURN_REWARDS_KEY: turn_rewards(player, options.gym_gamma),
                          STATE_KEY: {"player": pid, "turns": len(player.rewards), "rewards": player.rewards,
                                      "mismatch": mismatch}}))
        if not samples:
            return replace(sample, status=Status.ABORTED)
        return samples[0] if len(samples) == 1 else samples
