"""A scaffolded package is a third party (distribution ``rl-plugin-NAME``), and a third party never
wins a name collision against a first-party plugin, even under a ``plasmid-*`` name: priority
comes from the kernel's list of this repository's distributions. Real wheels, built by pip from a
``plasmid new-plugin`` package and installed into a directory put on ``sys.path``."""

from __future__ import annotations

import importlib
import re
import sys

import pytest
from plasmid_e2e import pip, run_plasmid

from plasmid.plugins import PluginManager, Selection
from plasmid.registry import Registry

pytest.importorskip("plasmid_match", reason="collides with plasmid-match's reward 'exact'")


def scaffold_exact(tmp_path, distribution=None):
    """``plasmid new-plugin reward exact`` (reward ``exact``, plasmid-match's name), its
    distribution renamed to ``distribution`` when given, pip-installed into a directory; that
    directory."""
    proc = run_plasmid("new-plugin", "reward", "exact", "--dir", str(tmp_path / "src"), timeout=120)
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "src" / "rl-plugin-exact"
    assert root.is_dir()
    if distribution is not None:
        pyproject = root / "pyproject.toml"
        pyproject.write_text(re.sub(r'(?m)^name = ".*"$', f'name = "{distribution}"', pyproject.read_text()))
    target = tmp_path / "installed"
    pip("install", "--no-deps", "--target", str(target), str(root))
    return target


@pytest.mark.parametrize("distribution", [None, "plasmid-exact"], ids=["scaffolded", "plasmid-prefix"])
def test_a_scaffolded_reward_named_like_a_first_party_one_does_not_displace_it(tmp_path, monkeypatch, capsys,
                                                                                distribution):
    target = scaffold_exact(tmp_path, distribution)
    monkeypatch.syspath_prepend(str(target))
    importlib.invalidate_caches()
    try:
        manager = PluginManager()
        manager.load(Selection.parse(None))   # everything installed, the scaffold auto-loaded
        owner = Registry.collect(manager).get("reward", "exact").plugin
    finally:
        sys.modules.pop("plasmid_exact", None)
    assert (owner.name, owner.distribution) == ("match", "plasmid-match")
    dist = distribution or "rl-plugin-exact"
    assert manager.infos["exact"].distribution == dist
    assert f"skipping reward 'exact' of plugin 'exact' (distribution {dist} 0.1.0)" in capsys.readouterr().err
