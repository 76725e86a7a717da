"""``plasmid new-plugin FAMILY NAME`` writes a complete package (installing it and running its
tests is checked end to end in tests/test_new_plugin.py,
every family's package running its own tests in tests/test_scaffold_families.py)."""

from __future__ import annotations

import ast
import tomllib

import pytest
from plasmid_scaffold.templates import FAMILIES, package_files, write_package

import plasmid
from plasmid.app.cli import main
from plasmid.errors import UsageError


def test_the_package_has_an_entry_point_a_module_and_a_contract_test(tmp_path):
    root = write_package("reward", "my-judge", tmp_path)
    assert root == tmp_path / "rl-plugin-my-judge"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["name"] == "rl-plugin-my-judge"
    assert project["entry-points"]["plasmid"] == {"my-judge": "plasmid_my_judge.plugin"}
    major, minor = (int(part) for part in plasmid.__version__.split(".")[:2])
    assert project["dependencies"] == [f"plasmid>={major}.{minor},<{major}.{minor + 1}"]
    test = (root / "tests" / "test_my_judge_reward.py").read_text()
    assert "class TestMyJudgeRewardContract(RewardContract):" in test
    assert 'register("my-judge", "plasmid_my_judge.reward:MyJudgeReward")' in (
        root / "src" / "plasmid_my_judge" / "plugin.py").read_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_python_file_parses(family):
    for relative, text in package_files("x2", family).items():
        if relative.endswith(".py"):
            ast.parse(text, relative)


@pytest.mark.parametrize("name", ["My-Judge", "2fast", "a_b", "judge-", ""])
def test_names_are_lower_case_words_joined_by_dashes(tmp_path, name):
    with pytest.raises(UsageError, match="lower-case letters, digits and dashes"):
        write_package("reward", name, tmp_path)


def test_it_refuses_to_overwrite_and_to_scaffold_other_families(tmp_path):
    write_package("reward", "twice", tmp_path)
    with pytest.raises(UsageError, match="already exists"):
        write_package("reward", "twice", tmp_path)
    with pytest.raises(UsageError, match="only reward, filter, tool, datasource, loss, generate, engine, trainer, "
                                         "weight-sync, observer packages"):
        write_package("runtime", "mine", tmp_path)


def test_the_cli_lists_what_it_wrote(tmp_path, capsys):
    assert main(["new-plugin", "reward", "judge", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "rl-plugin-judge" / "pyproject.toml") in out and "pip install -e" in out


def test_a_distribution_name_can_be_chosen_but_not_a_first_party_one(tmp_path, capsys):
    assert main(["new-plugin", "reward", "judge", "--dir", str(tmp_path), "--distribution", "acme-judge"]) == 0
    root = tmp_path / "acme-judge"
    assert tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"] == "acme-judge"
    assert (root / "README.md").read_text().startswith("# acme-judge\n")
    for taken in ("plasmid-judge", "plasmid_match", "plasmid"):
        with pytest.raises(UsageError, match=f"--distribution {taken}: .*reserved for plasmid's own"):
            write_package("reward", "judge", tmp_path / "other", distribution=taken)
    with pytest.raises(UsageError, match="--distribution 'acme judge': not a valid distribution name"):
        write_package("reward", "judge", tmp_path / "other", distribution="acme judge")
    assert not (tmp_path / "other").exists()
