"""The adapter's tests run against the real reasoning-gym package (the ``environments`` tox env).

Where plasmid-reasoning-gym or reasoning-gym is not installed (the ``embedded`` env collects
every plugin's tests) the directory is skipped, unless ``PLASMID_REQUIRE_ENVIRONMENTS`` is set
(the ``environments`` env sets it), where a missing package is a collection error instead.
"""

import importlib.util
import os

_installed = all(importlib.util.find_spec(name) is not None for name in ("plasmid_reasoning_gym", "reasoning_gym"))
if not _installed:
    if os.environ.get("PLASMID_REQUIRE_ENVIRONMENTS"):
        raise ImportError("PLASMID_REQUIRE_ENVIRONMENTS is set but plasmid-reasoning-gym or reasoning-gym is not "
                          "installed: pip install -r requirements/environments.txt")
    collect_ignore_glob = ["test_*.py"]
