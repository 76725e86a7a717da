"""The remote options are declared once: a bad value is a one-line error naming its flag, and the
typed read gives the declared defaults."""

from __future__ import annotations

import plasmid_remote.plugin
import pytest
from plasmid_remote.options import RemoteOptions
from plasmid_remote.reward import RemoteReward

from plasmid.errors import UsageError
from plasmid.testing import make_config


def test_the_typed_read_gives_the_declared_defaults():
    options = RemoteOptions.of(make_config(plasmid_remote.plugin))
    assert options == RemoteOptions.defaults()
    assert (options.rm_url, options.rm_timeout, options.rm_retries, options.rm_backoff, options.rm_concurrency,
            options.rm_batch_size, options.rm_batch_window, options.rm_token_env) == (
        None, 30.0, 3, 0.5, 8, 1, 0.01, None)


@pytest.mark.parametrize(("bad", "message"), [
    ({"rm_timeout": 0.0}, "--rm-timeout 0.0: must be > 0"),
    ({"rm_retries": -1}, "--rm-retries -1: must be >= 0"),
    ({"rm_backoff": -0.5}, "--rm-backoff -0.5: must be >= 0"),
    ({"rm_concurrency": 0}, "--rm-concurrency 0: must be >= 1"),
    ({"rm_batch_size": 0}, "--rm-batch-size 0: must be >= 1"),
    ({"rm_batch_window": -1.0}, "--rm-batch-window -1.0: must be >= 0"),
    ({"rm_retries": 2.5}, "--rm-retries: expected int, got 2.5"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_remote.plugin, **bad)
    assert str(raised.value) == message


def test_no_retries_is_allowed():
    assert RemoteOptions.of(make_config(plasmid_remote.plugin, rm_retries=0, rm_backoff=0.0)).rm_retries == 0


def test_the_reward_lists_the_options_it_reads():
    assert RemoteReward.option_classes == (RemoteOptions,)
