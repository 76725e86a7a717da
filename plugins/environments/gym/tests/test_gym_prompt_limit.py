"""``--max-prompt-length`` on the gym source: an episode whose first observation is too long a
prompt is skipped and counted (eval episodes at start-up, training ones as they are drawn), or
refused with ``--overlong-prompts error`` (:class:`plasmid.prompt_limits.PromptScreen`)."""

from __future__ import annotations

import dataclasses

import pytest
from plasmid_gym import plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config

SPEC = "textarena:GuessTheNumber-v0-train"


def source_with(tmp_path, tiny_model, **options):
    options = {"datasource": "gym", "gym_env": SPEC, "gym_size": 6, "gym_eval_size": 2, "model": tiny_model,
               "n_samples_per_prompt": 2, **options}
    return build("datasource", "gym", plugin, config=make_config(plugin, run_dir=tmp_path / "run", **options))


def test_training_episodes_are_screened_as_they_are_drawn(tmp_path, tiny_model, monkeypatch):
    whole = source_with(tmp_path, tiny_model)
    longest = max(whole._measure(seed)[1] for seed in [*whole.train, *whole.eval])
    source = source_with(tmp_path, tiny_model, max_prompt_length=longest)
    assert (source.prompt_report.rows, source.prompt_report.dropped_overlong) == (2, 0)   # the eval episodes
    # one training seed made too long: it is skipped, counted, and the epoch goes on without it
    long_seed = source.train[source.epoch_order(0)[1]]
    item = source._item

    def longer(seed):
        prompt, tokens, label, metadata = item(seed)
        return prompt, tokens + [tokens[-1]] * (seed == long_seed), label, metadata

    monkeypatch.setattr(source, "_item", longer)
    served = [group.samples[0].label["seed"] for _ in range(5) for group in source.get_groups(1)]
    assert served == [source.train[k] for k in source.epoch_order(0) if source.train[k] != long_seed]
    assert source.prompt_report.dropped_overlong == 1 and source.prompt_report.rows == 2 + 6
    source.screen.limit = dataclasses.replace(source.screen.limit, overlong="error")
    with pytest.raises(UsageError, match=rf"episode seed {long_seed}: the prompt has {longest + 1} tokens, more "
                                         rf"than --max-prompt-length {longest}"):
        for _ in range(6):
            source.get_groups(1)


def test_eval_episodes_are_screened_at_start_up(tmp_path, tiny_model):
    whole = source_with(tmp_path, tiny_model)
    evals = {seed: whole._measure(seed)[1] for seed in whole.eval}
    shortest = min(evals.values())
    with pytest.raises(UsageError, match="eval episodes: every one of its 2 prompt"):
        source_with(tmp_path, tiny_model, max_prompt_length=shortest - 1)
    first = next(seed for seed, length in evals.items() if length == max(evals.values()))
    with pytest.raises(UsageError, match=rf"episode seed {first}: the prompt has {evals[first]} tokens"):
        source_with(tmp_path, tiny_model, max_prompt_length=max(evals.values()) - 1, overlong_prompts="error")
