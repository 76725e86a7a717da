"""``objectstore`` and ``broadcast`` move weights between processes: with the trainer and engines
in this process they refuse with an error naming the runtime to use (their contract runs against
the Ray runtime's actors in plasmid-ray's tests)."""

from __future__ import annotations

import plasmid_sync.plugin
import pytest

from plasmid import testing
from plasmid.errors import UsageError


class LocalProvider:
    """Stands for a trainer or engine object living in this process."""


@pytest.mark.parametrize("provider", ["objectstore", "broadcast"])
def test_a_cross_process_sync_refuses_providers_of_this_process(provider):
    config = testing.make_config(plasmid_sync.plugin)
    sync = testing.build("weight_sync", provider, plasmid_sync.plugin, config=config)
    with pytest.raises(UsageError, match=rf"--weight-sync {provider} .* the trainer, engine 0 run in this process.*"
                                         r"--runtime ray"):
        testing.run(sync.sync(LocalProvider(), [LocalProvider()], 1))
