"""``--max-prompt-length`` on the gym source: episodes whose first observation is too long a prompt
are left out and counted, or refused with ``--overlong-prompts error``
(:class:`plasmid.prompt_limits.PromptScreen`)."""

from __future__ import annotations

import pytest
from plasmid_gym import plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config

SPEC = "textarena:GuessTheNumber-v0-train"


def source_with(tmp_path, tiny_model, **options):
    options = {"datasource": "gym", "gym_env": SPEC, "gym_size": 6, "gym_eval_size": 2, "model": tiny_model,
               "n_samples_per_prompt": 2, **options}
    return build("datasource", "gym", plugin, config=make_config(plugin, run_dir=tmp_path / "run", **options))


def test_overlong_episodes_are_dropped_and_counted_or_refused(tmp_path, tiny_model):
    whole = source_with(tmp_path, tiny_model)
    train = {seed: whole._measure(seed)[1] for seed in whole.train}
    evals = [whole._measure(seed)[1] for seed in whole.eval]
    longest = max(train.values())
    assert whole.prompt_report.rows == 8 and whole.prompt_report.dropped_overlong == 0

    if min(train.values()) < longest:        # observations of several lengths: the longest ones go
        source = source_with(tmp_path, tiny_model, max_prompt_length=longest - 1)
        assert source.train == [seed for seed, length in train.items() if length < longest]
        assert source.prompt_report.dropped_overlong == sum(n == longest for n in [*train.values(), *evals])
    else:                                    # one length: nothing is left
        with pytest.raises(UsageError, match="training episodes: every one of its 6 prompt"):
            source_with(tmp_path, tiny_model, max_prompt_length=longest - 1)
    first = next(seed for seed, length in train.items() if length == longest)
    with pytest.raises(UsageError, match=rf"episode seed {first}: the prompt has {longest} tokens, more than "
                                         rf"--max-prompt-length {longest - 1}"):
        source_with(tmp_path, tiny_model, max_prompt_length=longest - 1, overlong_prompts="error")
