"""``--max-prompt-length`` on the reasoning-gym source: entries whose prompt is too long are left
out of their split and counted, or refused with ``--overlong-prompts error``
(:class:`plasmid.prompt_limits.PromptScreen`)."""

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


def test_overlong_entries_are_dropped_from_both_splits_and_counted(tmp_path):
    whole = source_with(tmp_path)
    train, evals = lengths(whole, whole.train), lengths(whole, whole.eval)
    limit = sorted({*train.values(), *evals.values()})[-2]     # below the longest: some entries go
    dropped = sum(length > limit for length in [*train.values(), *evals.values()])
    assert dropped and whole.prompt_report.dropped_overlong == 0

    source = source_with(tmp_path, max_prompt_length=limit)
    assert source.train_entries == [k for k, length in train.items() if length <= limit]
    report = source.prompt_report
    assert (report.rows, report.dropped_overlong, report.limit) == (18, dropped, f"--max-prompt-length {limit}")
    served = [sample for _ in range(3) for group in source.get_groups(4) for sample in group.samples]
    assert served and all(sample.prompt_length <= limit for sample in served)
    eval_groups = source.eval_groups()
    assert len(eval_groups) == sum(length <= limit for length in evals.values())
    assert [group.index for group in eval_groups] == list(range(len(eval_groups)))


def test_with_overlong_prompts_error_the_first_one_stops_the_build(tmp_path):
    whole = source_with(tmp_path)
    train = lengths(whole, whole.train)
    first = min(train, key=lambda k: (train[k] != max(train.values()), k))
    with pytest.raises(UsageError, match=rf"reasoning-gym train entry {first} \(chain_sum\): the prompt has "
                                         rf"{train[first]} tokens, more than --max-prompt-length"):
        source_with(tmp_path, max_prompt_length=max(train.values()) - 1, overlong_prompts="error")


def test_a_limit_below_every_prompt_is_one_error(tmp_path):
    with pytest.raises(UsageError, match="the reasoning-gym train split: every one of its 12 prompt"):
        source_with(tmp_path, max_prompt_length=1)
