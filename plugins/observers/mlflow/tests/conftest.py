"""The observer's tests run against the real mlflow package (mlflow-skinny) (the ``trackers`` tox env).

Where plasmid_mlflow or mlflow is not installed (the ``embedded`` env collects every plugin's tests) the
directory is skipped, unless ``PLASMID_REQUIRE_TRACKERS`` is set (the ``trackers`` env sets it),
where a missing package is a collection error instead.
"""

import importlib.util
import os

_installed = all(importlib.util.find_spec(name) is not None for name in ("plasmid_mlflow", "mlflow"))
if not _installed:
    if os.environ.get("PLASMID_REQUIRE_TRACKERS"):
        raise ImportError("PLASMID_REQUIRE_TRACKERS is set but plasmid_mlflow or mlflow is not installed: "
                          "pip install -r requirements/trackers.txt")
    collect_ignore_glob = ["test_*.py"]
