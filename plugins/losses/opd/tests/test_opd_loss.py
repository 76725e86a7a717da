"""What --loss opd computes and what --generate opd attaches, on hand-made batches and samples."""

from __future__ import annotations

import math
from pathlib import Path

import plasmid_opd.plugin
import pytest
import torch
from plasmid_opd.generate import TEACHER_LOGPROBS_KEY, OPDGenerate

from plasmid import testing
from plasmid.types import GenerationOutput, LossBatch, Sample, SamplingParams, Status

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
OLD = torch.log(torch.tensor([[0.5, 0.25, 0.1], [0.2, 0.1, 0.1]]))
TEACHER = torch.log(torch.tensor([[0.25, 0.5, 0.9], [0.8, 0.9, 0.9]]))


TEACHER_DIR = str(Path(__file__).parent)       # an existing directory: the loss never reads it


def make_loss(**options):
    config = testing.make_config(plasmid_opd.plugin, teacher_model=TEACHER_DIR, **options)
    return testing.build("loss", "opd", plasmid_opd.plugin, config=config)


def batch(loss, rewards=(1.0, 0.0)) -> LossBatch:
    made = LossBatch(rewards=torch.tensor(rewards), group_index=torch.zeros(2, dtype=torch.long), response_mask=MASK,
                     old_logprobs=OLD, ref_logprobs=TEACHER, total_tokens=3, total_samples=2)
    made.advantages, made.returns = loss.advantages(made)
    return made


def test_the_advantage_is_the_negative_reverse_kl_per_token():
    loss = make_loss()
    assert not loss.needs_ref and loss.needs_old_logprobs and loss.reference_logprobs_key == TEACHER_LOGPROBS_KEY
    made = batch(loss)
    # log p_teacher - log p_student: ln(1/2), ln 2 | ln 4; 0 where masked
    assert torch.allclose(made.advantages, torch.tensor([[-math.log(2), math.log(2), 0.0], [math.log(4), 0, 0]]))
    assert made.returns is None
    _, metrics = loss.policy_loss(made, OLD.clone().requires_grad_(True), None)
    assert metrics["opd_reverse_kl"] == pytest.approx((math.log(2) - math.log(2) - math.log(4)) / 3, rel=1e-5)
    assert metrics["kl"] > 0 and metrics["ppo_kl"] == 0.0


def test_the_reward_weight_adds_the_group_relative_reward_advantage():
    made = batch(make_loss(opd_reward_weight=0.5), rewards=(1.0, 0.0))
    group = 0.5 / (1 / math.sqrt(2) + 1e-6)                   # rewards [1, 0]: (r - 0.5) / std, std = 1/sqrt(2)
    expected = torch.tensor([[-math.log(2) + 0.5 * group, math.log(2) + 0.5 * group, 0.0],
                             [math.log(4) - 0.5 * group, 0.0, 0.0]])
    assert torch.allclose(made.advantages, expected, atol=1e-6)


def test_without_the_teacher_the_loss_says_what_is_missing():
    loss = make_loss()
    made = LossBatch(rewards=torch.zeros(1), group_index=torch.zeros(1, dtype=torch.long), response_mask=MASK[:1],
                     old_logprobs=OLD[:1], total_tokens=2, total_samples=1)
    with pytest.raises(ValueError, match="--loss opd needs the reference model's log-probs"):
        loss.advantages(made)


class Engine:
    def __init__(self, scores=None):
        self.scores, self.calls = scores, []

    async def generate(self, prompt_ids, params):
        return GenerationOutput(token_ids=[7, 8], logprobs=[-0.1, -0.2], status=Status.COMPLETED, weight_version=1)

    async def score(self, token_ids, prompt_length, temperature):
        self.calls.append((list(token_ids), prompt_length, temperature))
        return self.scores if self.scores is not None else [-1.5] * (len(token_ids) - prompt_length)


class Tokenizer:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


class View:
    tokenizer = Tokenizer()

    def engine_for(self, sample):
        return Engine()


def generate(teacher, temperature=0.7):
    fn = OPDGenerate(testing.make_config(plasmid_opd.plugin, teacher_model=TEACHER_DIR), teacher=teacher)
    params = SamplingParams(temperature=temperature, max_new_tokens=4)
    return testing.run(fn(View(), Sample(tokens=[1, 2, 3], index=5), params))


def test_generate_attaches_the_teachers_scores_of_the_response_at_the_sampling_temperature():
    teacher = Engine()
    done = generate(teacher)
    assert done.tokens == [1, 2, 3, 7, 8] and done.rollout_logprobs == [-0.1, -0.2]
    assert done.metadata[TEACHER_LOGPROBS_KEY] == [-1.5, -1.5]
    assert teacher.calls == [([1, 2, 3, 7, 8], 3, 0.7)]
    generate(teacher, temperature=0.0)
    assert teacher.calls[-1][2] == 1.0                          # greedy requests are scored at 1


def test_a_teacher_scoring_the_wrong_number_of_tokens_is_an_error_naming_the_sample():
    with pytest.raises(ValueError, match="teacher scored 1 tokens of sample 5's 2-token response"):
        generate(Engine(scores=[-1.0]))


def test_the_teacher_engine_serves_the_teacher_model_with_the_runs_engine_kind(tmp_path):
    torchgen = pytest.importorskip("plasmid_torchgen.plugin")
    from plasmid_opd.generate import build_teacher

    from plasmid_torch.tiny import build_tiny_model

    student, teacher_dir = build_tiny_model(tmp_path / "student", seed=0), build_tiny_model(tmp_path / "t", seed=1)
    registry = testing.make_registry(torchgen)

    def config(model, **options):
        return testing.make_config(plasmid_opd.plugin, torchgen, model=str(model), engine="torchgen",
                                   run_dir=tmp_path / "run", **options)

    teacher = build_teacher(config(student, teacher_model=str(teacher_dir)), registry)
    direct = testing.build("engine", "torchgen", torchgen, config=config(teacher_dir, teacher_model=TEACHER_DIR))
    own = testing.build("engine", "torchgen", torchgen, config=config(student, teacher_model=TEACHER_DIR))
    tokens = [1, 3, 13, 3, 14, 5, 6]
    try:
        scores = [testing.run(engine.score(tokens, 5, 1.0)) for engine in (teacher, direct, own)]
    finally:
        for engine in (teacher, direct, own):
            testing.run(engine.shutdown())
    assert scores[0] == pytest.approx(scores[1], abs=1e-6) and scores[0] != pytest.approx(scores[2], abs=1e-3)
