"""The adapter's tests run against the real TextArena package (the ``environments`` tox env).

Where plasmid-gym or textarena is not installed (the ``embedded`` env collects every plugin's tests)
the directory is skipped, unless ``PLASMID_REQUIRE_ENVIRONMENTS`` is set, where a missing package
is a collection error instead.
"""

import importlib.util
import os

_installed = all(importlib.util.find_spec(name) is not None for name in ("plasmid_gym", "textarena"))
if not _installed:
    if os.environ.get("PLASMID_REQUIRE_ENVIRONMENTS"):
        raise ImportError("PLASMID_REQUIRE_ENVIRONMENTS is set but plasmid-gym or textarena is not installed: "
                          "pip install -r requirements/environments.txt")
    collect_ignore_glob = ["test_*.py"]
else:
    import pytest

    #: printable ASCII, tab and newline: TextArena's text games' observations
    ALPHABET = "\t\n" + "".join(chr(code) for code in range(32, 127))

    @pytest.fixture(scope="session")
    def tiny_model(tmp_path_factory):
        """A tiny model whose char tokenizer (with its chat template) covers the observations."""
        from plasmid_torch.tiny import build_tiny_model

        return str(build_tiny_model(tmp_path_factory.mktemp("gym") / "model", alphabet=ALPHABET, seed=0,
                                    max_positions=2048, hidden_size=32, num_layers=1, num_heads=2))
