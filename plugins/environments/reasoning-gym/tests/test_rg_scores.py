"""plasmid's reward equals reasoning-gym's own scorer on the same entries, for correct, wrong and
malformed answers, on entries the data source served (so label -> entry is checked too)."""

import asyncio
import collections

import pytest
import reasoning_gym
from plasmid_reasoning_gym import plugin
from plasmid_reasoning_gym.mixture import Split, parse_mixture
from plasmid_reasoning_gym.reward import extract
from reasoning_gym.utils import extract_answer

from plasmid.testing import build, make_config
from plasmid.testing.contracts.reward import make_sample

DATASETS = ("basic_arithmetic", "chain_sum", "leg_counting", "spell_backward", "word_sorting")


def responses(answer: str) -> dict[str, str]:
    """Correct, wrong and malformed responses to an entry whose answer is ``answer``."""
    return {
        "correct": f"Let me think.\n<answer>{answer}</answer>",
        "correct, spaced": f"<answer> {answer} </answer>\n",
        "wrong": "<answer>zzz</answer>",
        "answer and more": f"<answer>{answer}9</answer>",
        "partly right": f"<answer>so it is {answer}</answer>",
        "last of two tags": f"<answer>1</answer> no: <answer>{answer}</answer>",
        "untagged": answer,
        "unclosed": f"<answer>{answer}",
        "empty": "",
        "garbage": "<answer></answer>\x00\ufffd",
    }


_THEIR_DATASETS: dict[str, object] = {}


def reasoning_gyms_own_score(label: dict, response: str) -> float:
    """What reasoning-gym computes itself: a dataset built by ``reasoning_gym.create_dataset``
    from the label's config (here, not plasmid's cache), its entry at the label's index,
    ``score_answer(extract_answer(response), entry)``."""
    key = repr((label["dataset"], sorted(label["config"].items())))
    if key not in _THEIR_DATASETS:
        _THEIR_DATASETS[key] = reasoning_gym.create_dataset(label["dataset"], **label["config"])
    dataset = _THEIR_DATASETS[key]
    entry = dataset[label["index"]]
    return dataset.score_answer(extract_answer(response), entry)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Training and eval samples of a five-dataset mixture, and the reward, built as plasmid train
    builds them (the tiny-model recipe included)."""
    config = make_config(plugin, run_dir=tmp_path_factory.mktemp("rg") / "run", datasource="reasoning-gym",
                         rg_dataset=tuple(DATASETS), rg_size=60, rg_eval_size=10, n_samples_per_prompt=1)
    source = build("datasource", "reasoning-gym", plugin, config=config)
    samples = [group.samples[0] for group in source.get_groups(60) + source.eval_groups()]
    return samples, build("reward", "reasoning-gym", plugin, config=config)


def test_the_mixture_serves_every_dataset(served):
    samples, _ = served
    assert {sample.label["dataset"] for sample in samples} == set(DATASETS)


def test_the_label_rebuilds_the_entry_the_prompt_came_from(served):
    samples, _ = served
    for sample in samples:
        entry = reasoning_gym.create_dataset(sample.label["dataset"], **sample.label["config"])[sample.label["index"]]
        prompt = sample.prompt if isinstance(sample.prompt, str) else sample.prompt[-1]["content"]
        assert entry["question"] in prompt
        assert sample.metadata == {"dataset": sample.label["dataset"], "subset": sample.label["dataset"],
                                   "answer": entry["answer"]}


def test_the_reward_equals_reasoning_gyms_own_scorer(served):
    samples, reward = served
    seen = collections.defaultdict(set)
    for sample in samples:
        for kind, response in responses(sample.metadata["answer"]).items():
            scored = make_sample(response, sample.label, prompt="q")
            ours = asyncio.run(reward(scored))
            theirs = reasoning_gyms_own_score(sample.label, response)
            assert ours == theirs, (sample.label, kind, response)
            assert isinstance(ours, float)
            seen[kind].add(ours)
    assert seen["correct"] == seen["correct, spaced"] == seen["last of two tags"] == {1.0}
    assert seen["untagged"] == seen["unclosed"] == seen["empty"] == {0.0}  # no tags: no answer
    assert 0.0 in seen["wrong"] and 1.0 not in seen["wrong"]
    assert seen["partly right"] - {0.0, 1.0}, "some scorer gives partial credit"


@pytest.mark.parametrize(("answer_format", "response", "expected"), [
    ("tags", "x\n<answer> 42 </answer>", "42"),
    ("tags", "42", None),
    ("last-line", "thinking\n  42  \n\n", "42"),
    ("last-line", " \n", None),
    ("none", " 42\n", " 42\n"),
])
def test_answer_formats(answer_format, response, expected):
    assert extract(response, answer_format) == expected


def test_the_last_line_format_scores_an_untagged_answer(tmp_path):
    config = make_config(plugin, run_dir=tmp_path / "run", rg_answer_format="last-line")
    reward = build("reward", "reasoning-gym", plugin, config=config)
    split = Split(parse_mixture(("chain_sum",), ()), split="train", size=3, seed=0)
    answer = split.entry(0)["answer"]
    assert asyncio.run(reward(make_sample(f"so:\n{answer}\n", split.label(0)))) == 1.0
    assert asyncio.run(reward(make_sample(f"{answer}\nthe end", split.label(0)))) == 0.0


def test_the_answer_tag_option_names_the_tag_that_is_scored(tmp_path):
    split = Split(parse_mixture(("chain_sum",), ()), split="train", size=3, seed=0)
    answer, label = split.entry(0)["answer"], split.label(0)
    responses = [f"<final>{answer}</final>", f"<answer>{answer}</answer>", "<final>zzz</final>"]
    scores = {}
    for tag in ("final", "answer"):
        config = make_config(plugin, run_dir=tmp_path / tag, rg_answer_tag=tag)
        reward = build("reward", "reasoning-gym", plugin, config=config)
        scores[tag] = [asyncio.run(reward(make_sample(response, label))) for response in responses]
    assert scores == {"final": [1.0, 0.0, 0.0], "answer": [0.0, 1.0, 0.0]}


def test_a_label_carrying_the_entry_itself_is_scored_with_it(tmp_path):
    reward = build("reward", "reasoning-gym", plugin, config=make_config(plugin, run_dir=tmp_path / "run"))
    entry = reasoning_gym.create_dataset("chain_sum", seed=5, size=2)[1]
    label = {"dataset": "chain_sum", "entry": {"question": entry["question"], "answer": entry["answer"],
                                               "metadata": {}}}
    assert asyncio.run(reward(make_sample(f"<answer>{entry['answer']}</answer>", label))) == 1.0


@pytest.mark.parametrize("label", ["42", None, {"dataset": "chain_sum"}, {"answer": "3"}])
def test_a_label_that_is_no_reasoning_gym_entry_fails_the_sample_in_one_line(tmp_path, label):
    reward = build("reward", "reasoning-gym", plugin, config=make_config(plugin, run_dir=tmp_path / "run"))
    with pytest.raises(ValueError, match="reasoning-gym") as raised:
        asyncio.run(reward(make_sample("<answer>3</answer>", label)))
    assert "\n" not in str(raised.value)


def test_weights_set_the_mixture_and_the_eval_split_comes_from_other_seeds():
    mixture = parse_mixture(("chain_sum:3", "leg_counting:1"), ())
    train = Split(mixture, split="train", size=400, seed=7)
    counts = collections.Counter(train.locate(k)[0] for k in range(train.size))
    assert 0.65 < counts["chain_sum"] / train.size < 0.85
    evaluation = Split(mixture, split="eval", size=400, seed=7)
    assert train.configs["chain_sum"]["seed"] != evaluation.configs["chain_sum"]["seed"]
    assert [train.entry(k) for k in range(5)] != [evaluation.entry(k) for k in range(5)]
    again = Split(parse_mixture(("chain_sum:3", "leg_counting:1"), ()), split="train", size=400, seed=7)
    assert [again.label(k) for k in range(50)] == [train.label(k) for k in range(50)]
    other = Split(mixture, split="train", size=400, seed=8)
    assert [other.label(k) for k in range(50)] != [train.label(k) for k in range(50)]
