"""The adapter's tests run against the real packages: TextArena (the ``environments`` tox env) and
GEM, gem-llm (the ``environments-gem`` tox env, apart because gem-llm pins an older reasoning-gym).

``test_gym_gem.py`` needs plasmid-gym and gem; every other file needs plasmid-gym and textarena.
Where those are not installed (the ``embedded`` env collects every plugin's tests) the files are
skipped, unless ``PLASMID_REQUIRE_ENVIRONMENTS`` (textarena's) or ``PLASMID_REQUIRE_GEM`` (gem's) is
set, where a missing package is a collection error instead.
"""

import importlib.util
import os
import sys
from pathlib import Path

GEM_TESTS = "test_gym_gem.py"

# the episode tests import their scripted engine from this directory (gym_scripted_engine.py)
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _installed(*names: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in names)


collect_ignore_glob = []
if not _installed("plasmid_gym", "textarena"):
    if os.environ.get("PLASMID_REQUIRE_ENVIRONMENTS"):
        raise ImportError("PLASMID_REQUIRE_ENVIRONMENTS is set but plasmid-gym or textarena is not installed: "
                          "pip install -r requirements/environments.txt")
    collect_ignore_glob += [path.name for path in Path(__file__).parent.glob("test_*.py") if path.name != GEM_TESTS]
if not _installed("plasmid_gym", "gem"):
    if os.environ.get("PLASMID_REQUIRE_GEM"):
        raise ImportError("PLASMID_REQUIRE_GEM is set but plasmid-gym or gem (gem-llm) is not installed: "
                          "pip install -r requirements/embedded.txt -r requirements/environments-gem.txt")
    collect_ignore_glob.append(GEM_TESTS)

if _installed("plasmid_gym"):
    import pytest

    #: printable ASCII, tab and newline: TextArena's and GEM's text games' observations
    ALPHABET = "\t\n" + "".join(chr(code) for code in range(32, 127))

    @pytest.fixture(scope="session")
    def tiny_model(tmp_path_factory):
        """A tiny model whose char tokenizer (with its chat template) covers the observations."""
        from plasmid_torch.tiny import build_tiny_model

        return str(build_tiny_model(tmp_path_factory.mktemp("gym") / "model", alphabet=ALPHABET, seed=0,
                                    max_positions=2048, hidden_size=32, num_layers=1, num_heads=2))
