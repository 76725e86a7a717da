"""The observer's tests run against the real wandb package (the ``trackers`` tox env).

Where plasmid_wandb or wandb is not installed (the ``embedded`` env collects every plugin's tests) the
directory is skipped, unless ``PLASMID_REQUIRE_TRACKERS`` is set (the ``trackers`` env sets it),
where a missing package is a collection error instead.
"""

import importlib.util
import os

_installed = all(importlib.util.find_spec(name) is not None for name in ("plasmid_wandb", "wandb"))
if not _installed:
    if os.environ.get("PLASMID_REQUIRE_TRACKERS"):
        raise ImportError("PLASMID_REQUIRE_TRACKERS is set but plasmid_wandb or wandb is not installed: "
                          "pip install -r requirements/trackers.txt")
    collect_ignore_glob = ["test_*.py"]
