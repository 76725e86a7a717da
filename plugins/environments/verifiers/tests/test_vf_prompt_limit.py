"""``--max-prompt-length`` on the verifiers source: rows whose rendered prompt is too long are left
out and counted, or refused with ``--overlong-prompts error``
(:class:`plasmid.prompt_limits.PromptScreen`)."""

from __future__ import annotations

import pytest
from plasmid_verifiers import plugin

from plasmid.errors import UsageError
from plasmid.testing import build, make_config

OPTIONS = {"datasource": "verifiers", "vf_env": "vf_plasmid_sum", "n_samples_per_prompt": 2}


def source_with(tmp_path, **options):
    config = make_config(plugin, run_dir=tmp_path / "run", **{**OPTIONS, **options})
    return build("datasource", "verifiers", plugin, config=config)


def test_overlong_rows_are_dropped_and_counted_or_refused(tmp_path):
    whole = source_with(tmp_path)
    train = {k: whole._measure("row", whole.train)(k)[1] for k in range(len(whole.train))}
    evals = [whole._measure("eval row", whole.eval)(k)[1] for k in range(len(whole.eval))]
    longest = max(train.values())
    assert whole.prompt_report.dropped_overlong == 0 and whole.prompt_report.rows == len(train) + len(evals)

    if min(train.values()) < longest:        # rows of several lengths: the longest ones go
        source = source_with(tmp_path, max_prompt_length=longest - 1)
        assert source.train_rows == [k for k, length in train.items() if length < longest]
        dropped = sum(length == longest for length in [*train.values(), *evals])
        assert source.prompt_report.dropped_overlong == dropped
        served = [sample for group in source.get_groups(6) for sample in group.samples]
        assert all(sample.prompt_length < longest for sample in served)
    else:                                    # one length: nothing is left
        with pytest.raises(UsageError, match="training dataset: every one of its"):
            source_with(tmp_path, max_prompt_length=longest - 1)
    first = min(k for k, length in train.items() if length == longest)
    with pytest.raises(UsageError, match=rf"verifiers vf_plasmid_sum row {first}: the prompt has {longest} tokens"):
        source_with(tmp_path, max_prompt_length=longest - 1, overlong_prompts="error")
