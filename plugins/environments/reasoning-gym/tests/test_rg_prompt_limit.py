"""``--max-prompt-length`` on the reasoning-gym source: entries whose prompt is too long are
skipped and counted (the eval split's at start-up, training entries as they are drawn), or refused
with ``--overlong-prompts error`` (:class:`plasmid.prompt_limits.PromptScreen`)."""

from __future__ import annotations

import pytest
from plasmid_reasoning_gym import plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config

OPTIONS = {"datasource": "reasoning-gym", "rg_dataset": ("chain_sum",), "rg_config": ("chain_sum.max_terms=6",),
           "rg_size": 12, "rg_eval_size": 6, "n_samples_per_prompt": 2}


def source_with(tmp_path, **options):
    config = make_config(plugin, run_dir=tmp_path / "run", **{**OPTIONS, **options})
    return build("datasource", "reasoning-gym", plugin, config=config)


def lengths(source, split):
    return {k: source._measure(split, k)[1] for k in range(split.size)}


def test_overlong_entries_are_skipped_and_counted(tmp_path):
    whole = source_with(tmp_path)
    train, evals = lengths(whole, whole.train), lengths(whole, whole.eval)
    limit = sorted({*train.values(), *evals.values()})[-2]     # below the longest: some entries go
    dropped_eval = sum(length > limit for length in evals.values())
    dropped_train = sum(length > limit for length in train.values())
    assert dropped_eval + dropped_train and whole.prompt_report.dropped_overlong == 0

    source = source_with(tmp_path, max_prompt_length=limit)
    report = source.prompt_report           # at start-up: the eval split only
    assert (report.rows, report.dropped_overlong, report.limit) == (6, dropped_eval, f"--max-prompt-length {limit}")
    fitting = 12 - dropped_train            # one training epoch: every entry drawn once
    served = [group.samples[0] for _ in range(fitting) for group in source.get_groups(1)]
    assert all(sample.prompt_length <= limit for sample in served)
    assert len({tuple(sample.tokens) for sample in served}) == fitting
    assert source.prompt_report.dropped_overlong == dropped_eval + dropped_train
    eval_groups = source.eval_groups()
    assert len(eval_groups) == sum(length <= limit for length in evals.values())
    assert [group.index for group in eval_groups] == list(range(len(eval_groups)))


def test_with_overlong_prompts_error_an_overlong_prompt_stops_the_run(tmp_path):
    whole = source_with(tmp_path)
    evals = lengths(whole, whole.eval)
    first = min(evals, key=lambda k: (evals[k] != max(evals.values()), k))
    with pytest.raises(UsageError, match=rf"reasoning-gym eval entry {first} \(chain_sum\): the prompt has "
                                         rf"{evals[first]} tokens, more than --max-prompt-length"):
        source_with(tmp_path, max_prompt_length=max(evals.values()) - 1, overlong_prompts="error")
    train = lengths(whole, whole.train)
    source = source_with(tmp_path, max_prompt_length=max([*train.values(), *evals.values()]) - 1,
                         overlong_prompts="error")
    with pytest.raises(UsageError, match=r"reasoning-gym train entry \d+ \(chain_sum\): the prompt has"):
        for _ in range(12):
            source.get_groups(1)


def test_a_limit_below_every_prompt_is_one_error(tmp_path):
    with pytest.raises(UsageError, match="the reasoning-gym eval split: every one of its 6 prompt"):
        source_with(tmp_path, max_prompt_length=1)
