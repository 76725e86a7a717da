"""``plasmid train --datasource gym --gym-env textarena:GuessTheNumber-v0-train``: the recipe's
generate function, reward and tiny model, a few steps on a CPU against the real TextArena; and
``--gym-players 2`` (TicTacToe) through the driver, one sample per player."""

from __future__ import annotations

import json
import re

import pytest

from plasmid.app.cli import main
from plasmid.app.rollout_store import RolloutStore
from plasmid.types import GenerationOutput, Status


@pytest.mark.timeout(300)
def test_plasmid_train_plays_guess_the_number_with_the_recipe(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--datasource", "gym", "--gym-env", "textarena:GuessTheNumber-v0-train",
                 "--gym-max-turns", "2", "--gym-size", "8", "--gym-eval-size", "2", "--num-rollouts", "2",
                 "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
                 "--save-interval", "0", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "datasource=gym" in err and "generate=gym" in err and "reward=gym" in err
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert step["train/samples"] == 4.0 and "rollout/reward/gym" in step
        assert step["train/logprob_abs_diff_mean"] <= 1e-4


#: The moves TextArena's TicTacToe still allows, as its last observation lists them.
AVAILABLE = re.compile(r"Available Moves: ('\[\d\]'(?:, '\[\d\]')*)")


class FirstFreeCell:
    """Stands in for ``TorchEngine.generate`` (monkeypatched): plays the first move the board still
    allows (``[k]`` and end-of-sequence), its log-probs the engine's own (``TorchEngine.score`` at the
    request's temperature), so every game is legal and both players move; ``prompts`` records each
    request's prompt ids."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    async def __call__(self, engine, prompt_ids, params):
        from plasmid_torch.hf import load_tokenizer

        tokenizer = load_tokenizer(engine.model_path)
        moves = AVAILABLE.findall(tokenizer.decode(prompt_ids, skip_special_tokens=False))[-1]
        ids = tokenizer.encode(moves.split(", ")[0].strip("'"), add_special_tokens=False) + [tokenizer.eos_token_id]
        logprobs = await engine.score(list(prompt_ids) + ids, len(prompt_ids), params.temperature)
        self.prompts.append(list(prompt_ids))
        return GenerationOutput(ids, logprobs, Status.COMPLETED, engine.weight_version)


@pytest.mark.timeout(300)
def test_plasmid_train_with_two_players_gives_each_player_its_own_sample_and_prompt(tmp_path, capsys, monkeypatch):
    from plasmid_torchgen.engine import TorchEngine

    engine = FirstFreeCell()

    async def generate(self, prompt_ids, params):
        return await engine(self, prompt_ids, params)

    monkeypatch.setattr(TorchEngine, "generate", generate)
    run_dir, saved = tmp_path / "run", tmp_path / "rollouts"
    code = main(["train", "--datasource", "gym", "--gym-env", "textarena:TicTacToe-v0-train", "--gym-players", "2",
                 "--gym-size", "8", "--gym-eval-size", "2", "--num-rollouts", "2", "--prompts-per-step", "1",
                 "--n-samples-per-prompt", "2", "--eval-interval", "0", "--save-interval", "0",
                 "--run-dir", str(run_dir), "--save-rollouts", str(saved)])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    # first free cell each turn: O 0, X 1, O 2, X 3, O 4, X 5, O 6; player 0 wins on the 2-4-6 diagonal
    assert len(engine.prompts) == 2 * 2 * 7
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [step["step"] for step in metrics] == [0, 1]
    for step in metrics:
        assert step["train/samples"] == 4.0, "two samples per episode, one per player"
        assert step["train/logprob_abs_diff_mean"] <= 1e-4

    store = RolloutStore(saved)
    for rollout_id in (0, 1):
        batch = store.load(rollout_id)
        (group,) = batch.groups
        players = [sample.metadata["gym"]["player"] for sample in group.samples]
        assert players == [0, 1, 0, 1], "two episodes of the prompt, each player a sample of the group"
        assert [sample.reward for sample in group.samples] == [1.0, -1.0, 1.0, -1.0]
        for pid, sample in zip(players, group.samples, strict=True):
            (message,) = sample.prompt
            assert message["role"] == "user" and f"You are Player {pid} in Tic Tac Toe" in message["content"]
            assert sample.prompt_tokens in engine.prompts, "the sample's prompt is its player's first request"
            assert sum(sample.loss_mask) == (4 if pid == 0 else 3) * 4, "its own moves only: '[', k, ']', eos each"


@pytest.mark.timeout(300)
def test_plasmid_train_with_turn_credit_hands_the_loss_each_episodes_turn_rewards(tmp_path, capsys, monkeypatch):
    """``--turn-credit by-turn``: the trainer gives the grpo loss the turns gym recorded, whose rewards add up
    to each sample's reward (the episode return)."""
    import torch
    from plasmid_grpo.loss import GRPOLoss

    from plasmid_torch.turns import TurnLossBatch

    seen = []
    real = GRPOLoss.turn_advantages

    def spy(self, batch, rewards):
        seen.append(batch)
        return real(self, batch, rewards)

    monkeypatch.setattr(GRPOLoss, "turn_advantages", spy)
    run_dir = tmp_path / "run"
    code = main(["train", "--datasource", "gym", "--gym-env", "textarena:GuessTheNumber-v0-train",
                 "--gym-max-turns", "2", "--gym-size", "8", "--gym-eval-size", "2", "--num-rollouts", "1",
                 "--prompts-per-step", "2", "--n-samples-per-prompt", "2", "--eval-interval", "0",
                 "--save-interval", "0", "--turn-credit", "by-turn", "--run-dir", str(run_dir)])
    assert code == 0, capsys.readouterr().err[-3000:]
    [batch] = seen
    assert isinstance(batch, TurnLossBatch) and batch.turn_rewards.shape[0] == 4
    assert torch.allclose(torch.nansum(batch.turn_rewards, -1), batch.rewards)
    assert int(batch.turn_index.max()) == batch.turn_rewards.shape[1] - 1
