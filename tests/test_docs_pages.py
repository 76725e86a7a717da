"""docs/: every relative link points at a file or folder of the repository, the families table
of concepts.md is the kernel's family table, and plugins.md covers every family that
``plasmid new-plugin`` scaffolds (so a new scaffold or family without docs fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from plasmid_scaffold.templates import FAMILIES as SCAFFOLDED

from plasmid.families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(page: Path) -> list[str]:
    return [target for target in LINK.findall(page.read_text()) if "://" not in target]


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_relative_links_resolve(page):
    missing = [target for target in relative_links(page) if not (page.parent / target).exists()]
    assert not missing, f"{page.name} links to missing paths: {missing}"


def test_the_pages_are_there():
    assert {p.name for p in DOCS.glob("*.md")} >= {"index.md", "concepts.md", "plugins.md", "gpu.md", "options.md",
                                                   "hooks.md"}


def test_concepts_lists_every_family_with_its_option_and_suite():
    text = (DOCS / "concepts.md").read_text()
    for family in FAMILIES:
        row = next((line for line in text.splitlines() if line.startswith(f"| {family.name} |")), None)
        assert row is not None, f"concepts.md has no row for family {family.name}"
        assert f"`--{family.option.replace('_', '-')}`" in row and f"`{family.protocol}`" in row, row
        assert (f"`{family.contract_name}`" in row) if family.contract else (" - |" in row), row


def test_plugins_md_covers_every_scaffold():
    text = (DOCS / "plugins.md").read_text()
    for family in SCAFFOLDED:
        assert f"`plasmid new-plugin {family} NAME`" in text, family
    assert f"FAMILY: {', '.join(SCAFFOLDED)}" in text


def test_link_checking_finds_a_missing_target(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](exists.md) [b](missing.md#x) [c](https://example.org/x)\n")
    (tmp_path / "exists.md").write_text("")
    assert [t for t in relative_links(page) if not (tmp_path / t).exists()] == ["missing.md"]
