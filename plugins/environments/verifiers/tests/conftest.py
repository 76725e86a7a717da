"""The adapter's tests run against the real verifiers package and the fixture environments of
``tests/fixtures/plasmid-vf-fixtures`` (the ``environments`` tox env installs all three).

Where one of them is not installed (the ``embedded`` env collects every plugin's tests) the
directory is skipped, unless ``PLASMID_REQUIRE_ENVIRONMENTS`` is set (the ``environments`` env
sets it), where a missing package is a collection error instead.
"""

import importlib.util
import os

_needed = ("plasmid_verifiers", "verifiers", "vf_plasmid_sum", "vf_plasmid_tool", "vf_plasmid_v1_sum",
           "vf_plasmid_v1_tool", "plasmid_agent")
_installed = all(importlib.util.find_spec(name) is not None for name in _needed)
if not _installed:
    if os.environ.get("PLASMID_REQUIRE_ENVIRONMENTS"):
        raise ImportError("PLASMID_REQUIRE_ENVIRONMENTS is set but one of " + ", ".join(_needed) + " is not "
                          "installed: pip install -r requirements/environments.txt")
    collect_ignore_glob = ["test_*.py"]

if _installed:
    import pytest

    @pytest.fixture(scope="session")
    def tiny_model(tmp_path_factory):
        """The recipe's tiny model (printable ASCII covers both fixture environments), built once."""
        from plasmid_verifiers import plugin
        from plasmid_verifiers.recipe import prepare_tiny_model

        from plasmid.testing import make_config

        run_dir = tmp_path_factory.mktemp("vf-model")
        config = make_config(plugin, run_dir=run_dir, datasource="verifiers", vf_env="vf_plasmid_tool")
        prepare_tiny_model(config)
        return str(run_dir / "model")
