"""``--task toolcalc``: its problems, its recipe (tokenizer, warm start, multi-turn defaults) and the
``final-answer`` reward. That it is learnt with the calculator and not without is tests/test_toolcalc.py."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import torch
import transformers
from plasmid_tasks import plugin
from plasmid_tasks.encoding import char_token_ids
from plasmid_tasks.recipe import TINY_MODEL_SHAPE
from plasmid_tasks.source import TaskSource
from plasmid_tasks.tasks import make_task, toolcalc_low
from plasmid_tasks.toolcalc import (
    TAGS,
    TOOLCALC_ALPHABET,
    _demonstration_ids,
    final_answer,
    toolcalc_tokenizer,
    warm_start,
)

from plasmid import hookimpl
from plasmid.errors import UsageError
from plasmid.options import Options, option
from plasmid.testing import DataSourceContract, RewardContract, build, make_config
from plasmid.types import Sample
from plasmid_torch.hf import load_tokenizer
from plasmid_torch.tiny import DIGITS_ALPHABET, EOS_ID, tiny_config
from plasmid_torch.trainer_options import TrainerOptions


class ConversationOptions(Options, group="multiturn", description="what plasmid-multiturn declares"):
    max_turns: int = option(4, "turns", min=1)
    max_response_tokens: int | None = option(None, "budget", min=1)
    tool_call_format: str = option("tagged", "format")


class Trainer:
    """Stands for the trainer and multi-turn plugins of a run: they declare ``--lr`` and the
    conversation options."""

    @hookimpl
    def plasmid_addoption(self, parser):
        parser.add_options(TrainerOptions)
        parser.add_options(ConversationOptions)


def toolcalc_config(tmp_path, **options):
    options = {"task": "toolcalc", "toolcalc_warmup_steps": 2, **options}
    return make_config(plugin, Trainer(), run_dir=tmp_path / "run", datasource="tasks", **options)


# ---------------------------------------------------------------------------------- the problems
@pytest.mark.parametrize("digits", [1, 2, 3, 4])
def test_every_product_has_twice_the_operand_digits(digits):
    task = make_task("toolcalc", digits=digits)
    low = toolcalc_low(digits)
    assert (low - 1) ** 2 < 10 ** (2 * digits - 1) <= low**2
    assert task.domain_size == (10**digits - low) ** 2 and task.answer_length == 2 * digits
    rng = random.Random(digits)
    for item in [0, task.domain_size - 1, *(rng.randrange(task.domain_size) for _ in range(200))]:
        prompt, label = task.example(item)
        a, b = (int(x) for x in prompt.rstrip("=").split("*"))
        assert prompt == f"{a}*{b}=" and label == str(a * b) and len(label) == 2 * digits
        assert low <= a < 10**digits and low <= b < 10**digits
    assert task.example(0) == (f"{low}*{low}=", str(low * low))
    assert task.example(task.domain_size - 1)[0] == f"{10**digits - 1}*{10**digits - 1}="


def test_three_digit_problems_by_default_and_distinct_items_are_distinct_problems(tmp_path):
    config = toolcalc_config(tmp_path)
    assert config.option.task_digits == 3
    task = make_task("toolcalc", digits=2)
    assert len({task.example(item)[0] for item in range(task.domain_size)}) == task.domain_size


# ---------------------------------------------------------------------------------- the recipe
def test_the_recipe_sets_the_multiturn_defaults_the_reward_and_the_budgets(tmp_path):
    option = toolcalc_config(tmp_path).option
    assert (option.max_turns, option.tool_call_format) == (2, "compact")
    assert option.reward == ["final-answer"] and option.reward_weights == [("final-answer", 1.0)]
    # <call> 6 digits and * </call>; then <result> 6 digits </result> and 6 digits <eos>
    assert (option.max_new_tokens, option.max_response_tokens) == (9, 24)
    assert option.lr == 1e-3 and option.model == str(tmp_path / "run" / "model")


def test_the_recipe_keeps_what_the_user_gave(tmp_path):
    option = toolcalc_config(tmp_path, task_digits=2, max_new_tokens=30, tool_call_format="tagged", max_turns=3,
                             reward=["final-answer:2"], lr=2e-3, max_response_tokens=50).option
    assert (option.task_digits, option.max_new_tokens, option.max_response_tokens) == (2, 30, 50)
    assert (option.tool_call_format, option.max_turns, option.lr) == ("tagged", 3, 2e-3)
    assert option.reward == ["final-answer:2"] and option.reward_weights == [("final-answer", 2.0)]
    assert toolcalc_config(tmp_path / "two", task_digits=2).option.max_new_tokens == 7


def test_with_an_own_model_only_the_conversation_defaults_are_set(tmp_path):
    option = toolcalc_config(tmp_path, model=str(tmp_path)).option
    assert (option.max_turns, option.tool_call_format, option.reward) == (2, "compact", ["final-answer"])
    assert option.max_new_tokens == 64 and option.lr == TrainerOptions.defaults().lr


def test_problems_too_long_for_the_tiny_model_are_refused_before_anything_is_built(tmp_path):
    with pytest.raises(UsageError, match=r"toolcalc\(digits=8\) needs 73 positions .* smaller --task-digits"):
        toolcalc_config(tmp_path, task_digits=8)
    assert not (tmp_path / "run").exists()


def test_prepare_builds_the_toolcalc_model_warm_started_deterministically(tmp_path):
    first = toolcalc_config(tmp_path / "a", seed=3)
    TaskSource.prepare(first)
    TaskSource.prepare(toolcalc_config(tmp_path / "b", seed=3))
    TaskSource.prepare(toolcalc_config(tmp_path / "c", seed=3, toolcalc_warmup_steps=0))
    weights = {name: (tmp_path / name / "run" / "model" / "model.safetensors").read_bytes() for name in "abc"}
    assert weights["a"] == weights["b"], "the same seed builds the same warm-started model"
    assert weights["a"] != weights["c"], "the warm start changed the weights"
    model_dir = tmp_path / "a" / "run" / "model"
    shape = json.loads((model_dir / "config.json").read_text())
    assert (shape["hidden_size"], shape["num_hidden_layers"], shape["max_position_embeddings"]) == (64, 2, 64)
    tokenizer = load_tokenizer(str(model_dir))
    assert shape["vocab_size"] == 3 + len(TOOLCALC_ALPHABET) + len(TAGS)
    assert sorted(tokenizer.convert_tokens_to_ids(list(TAGS))) == list(range(shape["vocab_size"] - 4,
                                                                              shape["vocab_size"]))
    assert tokenizer.encode("<call>12*3</call><result>36</result>", add_special_tokens=False) == \
        tokenizer.encode("<call>", add_special_tokens=False) + char_token_ids("12*3", TOOLCALC_ALPHABET)[1:] + \
        tokenizer.encode("</call><result>", add_special_tokens=False) + char_token_ids("36")[1:] + \
        tokenizer.encode("</result>", add_special_tokens=False)
    assert all(len(tokenizer.encode(tag, add_special_tokens=False)) == 1 for tag in TAGS)


def test_the_sources_samples_carry_the_toolcalc_tokenizers_ids(tmp_path):
    config = toolcalc_config(tmp_path, n_samples_per_prompt=2)
    sample = build("datasource", "tasks", plugin, config=config).get_groups(1)[0].samples[0]
    tokenizer = load_tokenizer(config.option.model)
    assert sample.tokens == tokenizer(sample.prompt)["input_ids"] == char_token_ids(sample.prompt, TOOLCALC_ALPHABET)
    assert "*" in sample.prompt and sample.label == str(eval(sample.prompt.rstrip("=")))  # noqa: S307 - digits*digits
    assert TOOLCALC_ALPHABET.startswith(DIGITS_ALPHABET), "ids shared with the quickstart alphabet are the same"


# ---------------------------------------------------------------------------------- the warm start
def test_demonstrations_train_only_the_models_tokens():
    tokenizer = toolcalc_tokenizer()
    ids, targets = _demonstration_ids(tokenizer, "317*320=", "101440", call=True)
    text = tokenizer.decode(ids)
    assert text == "<bos>317*320=<call>317*320</call><result>101440</result>101440<eos>"
    spoken = tokenizer.decode([t for t in targets if t != -100])
    assert spoken == "<call>317*320</call>101440<eos>"
    assert targets[:9] == [-100] * 9 and ids[-1] == EOS_ID
    direct_ids, direct_targets = _demonstration_ids(tokenizer, "317*320=", "101440", call=False)
    assert tokenizer.decode([t for t in direct_targets if t != -100]) == "101440<eos>"
    assert len(direct_ids) == 9 + 7


def test_the_warm_start_learns_and_never_sees_held_out_items():
    tokenizer, task = toolcalc_tokenizer(), make_task("toolcalc", digits=1)  # 36 problems
    held_out = frozenset(range(0, 36, 2))
    seen = []
    original = task.example

    class Watched(type(task)):
        def example(self, item):
            seen.append(item)
            return original(item)

    watched = Watched(**{f: getattr(task, f) for f in ("name", "key", "domain_size", "answer_length", "digits")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(len(tokenizer), **TINY_MODEL_SHAPE))
    losses = warm_start(model, tokenizer, watched, held_out, steps=30, seed=0)
    assert seen and not set(seen) & held_out
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5, losses
    assert not model.training


# ---------------------------------------------------------------------------------- the reward
@pytest.mark.parametrize(("response", "answer"), [
    ("<call>12*34</call><result>408</result>408", "408"),
    ("<call>1*2</call><result>2</result><call>12*34</call><result>408</result> 408 ", "408"),
    ("<tool_call>{}</tool_call><tool_response>408</tool_response>408", "408"),
    ("408", "408"),
    ("<call>12*34</call><result>408</result>", ""),
    ("<call>12*34</call>", "<call>12*34</call>"),
])
def test_the_final_answer_is_what_follows_the_last_tool_answer(response, answer):
    assert final_answer(response) == answer


def score(response, label):
    reward = build("reward", "final-answer", plugin)
    return asyncio.run(reward(Sample(prompt="12*34=", response=response, label=label)))


def test_final_answer_reward_is_exact_match_of_the_final_answer():
    assert score("<call>12*34</call><result>408</result>408", "408") == 1.0
    assert score("<call>12*34</call><result>408</result>409", "408") == 0.0
    assert score("<call>12*34</call><result>408</result>", "408") == 0.0, "the tool's answer is not the model's"
    assert score("<call>12*34</call><result>408</result>4080", "408") == 0.0
    assert score("408", ["400", "408"]) == 1.0


class TestFinalAnswerContract(RewardContract):
    plugin = plugin
    provider = "final-answer"
    cases = [("<call>3*1</call><result>3</result>3", "3"), ("<call>3*1</call><result>3</result>4", "3"),
             ("3", "3"), ("<result>3</result>", "3")]


class TestToolCalcSource(DataSourceContract):
    """toolcalc with the recipe's model (no warm start: quicker) and a small domain (36 problems,
    6 held out, so the resume test crosses epochs)."""

    plugin = plugin
    provider = "tasks"
    config_options = {"task": "toolcalc", "task_digits": 1, "task_eval_size": 6, "toolcalc_warmup_steps": 0}


def test_without_a_model_toolcalc_prompts_are_encoded_with_its_alphabet():
    source = TaskSource(make_config(plugin, datasource="jsonl", task="toolcalc", task_digits=2))
    assert source.encode("32*33=") == char_token_ids("32*33=", TOOLCALC_ALPHABET) == \
        toolcalc_tokenizer()("32*33=")["input_ids"]
