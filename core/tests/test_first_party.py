"""First-party priority in name collisions comes from the kernel's own list of this repository's
distributions (plasmid.plugins.FIRST_PARTY), never from a name prefix a third party can take."""

from __future__ import annotations

import importlib.metadata as metadata
import tomllib
from pathlib import Path

import pytest

from plasmid import plugins

REPO = Path(__file__).resolve().parents[2]


def repo_distributions() -> set[str]:
    """The names in this repository's pyprojects: the kernel, plugins/*/*, libs/*."""
    paths = [REPO / "core" / "pyproject.toml", *REPO.glob("plugins/*/*/pyproject.toml"),
             *REPO.glob("libs/*/pyproject.toml")]
    return {tomllib.loads(path.read_text())["project"]["name"] for path in paths}


def test_the_first_party_list_is_exactly_the_repositorys_distributions():
    names = repo_distributions()
    assert len(names) > 30 and "plasmid-match" in names
    assert plugins.FIRST_PARTY == names


@pytest.mark.parametrize("name", ["plasmid-match", "plasmid_match", "Plasmid.Match", "plasmid"])
def test_a_listed_distribution_is_first_party_however_it_is_spelled(name):
    assert plugins.is_first_party(name)


@pytest.mark.parametrize("name", ["plasmid-squatter", "plasmid-my-judge", "rl-plugin-match", "plasmidx", ""])
def test_a_name_merely_starting_with_plasmid_is_not_first_party(name):
    assert not plugins.is_first_party(name)


class FakeDist:
    def __init__(self, name):
        self.name, self.version = name, "1.0"


def entry_point(name, value, distribution):
    return metadata.EntryPoint(name, value, "plasmid")._for(FakeDist(distribution))


def test_a_prefix_squatter_does_not_displace_a_third_party_found_first(monkeypatch):
    one, squatter = entry_point("same", "json", "rl-plugin-same"), entry_point("same", "csv", "plasmid-same")
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [one, squatter])
    shadowed: list[str] = []
    assert plugins.installed_entry_points(shadowed)["same"].value == "json"
    assert "of distribution plasmid-same 1.0 (csv)" in shadowed[0]
