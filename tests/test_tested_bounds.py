"""The declared dependency bounds are true: checked against ``requirements/constraints-tested.txt``,
the versions CI tested (written by ``tools/record_tested_versions.py`` from the tox envs).

The rule, for every third-party requirement (extras included) of every pyproject of the repository
(core, libs/torch, every plugin):

- it was tested: its distribution is in the record;
- its lower bound is not older than the oldest version CI tested. A lower bound is a claim that
  every version from it on works; below the oldest tested version nothing backs that claim (with
  transformers 4.45.2, once allowed by ``>=4.45``, the quickstart crashed on ``Qwen3Config``). A
  requirement without a lower bound claims every version and is refused too;
- some tested version is inside the declared range (the range is not a guess either).

The record lists every version tested in any env, so the oldest tested version is the oldest any
env installed (SGLang's env has its own torch); a bound above it is allowed (a plugin may need
more than another env tested).
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "requirements" / "constraints-tested.txt"
TOOL = ROOT / "tools" / "record_tested_versions.py"
LOWER = (">=", "==", "~=", ">", "===")


def _tool():
    spec = importlib.util.spec_from_file_location("record_tested_versions", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pyprojects() -> list[Path]:
    return [ROOT / "core" / "pyproject.toml", ROOT / "libs" / "torch" / "pyproject.toml",
            *sorted(ROOT.glob("plugins/*/*/pyproject.toml"))]


def requirements(pyproject: Path) -> list[Requirement]:
    project = tomllib.loads(pyproject.read_text())["project"]
    declared = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        declared.extend(extra)
    return [Requirement(line) for line in declared]


def bound_problems(pyproject: Path, tested: dict[str, dict[str, list[str]]]) -> list[str]:
    """One line per requirement of ``pyproject`` whose bounds the record does not back."""
    problems = []
    where = pyproject.relative_to(ROOT) if pyproject.is_relative_to(ROOT) else pyproject
    for requirement in requirements(pyproject):
        name = canonicalize_name(requirement.name)
        if name == "plasmid" or name.startswith("plasmid-"):
            continue  # this repository's own distributions, tested at their one version
        versions = tested.get(name)
        if not versions:
            problems.append(f"{where}: {requirement} was never tested (not in {RECORD.name})")
            continue
        oldest = min(versions, key=lambda v: Version(Version(v).public))
        lowers = [Version(spec.version) for spec in requirement.specifier if spec.operator in LOWER]
        if not lowers:
            problems.append(f"{where}: {requirement} has no lower bound; CI tested {name} {oldest} at the oldest")
        elif max(lowers) < Version(Version(oldest).public):
            problems.append(f"{where}: {requirement} claims versions older than any CI tested: the oldest tested is "
                            f"{oldest} ({', '.join(versions[oldest])})")
        if not any(requirement.specifier.contains(Version(v).public, prereleases=True) for v in versions):
            problems.append(f"{where}: {requirement} admits no version CI tested ({', '.join(sorted(versions))})")
    return problems


def test_every_declared_bound_is_backed_by_a_tested_version():
    tested = _tool().parse(RECORD.read_text())
    problems = [problem for pyproject in pyprojects() for problem in bound_problems(pyproject, tested)]
    assert not problems, "\n".join(problems)


def test_a_bound_below_the_oldest_tested_version_an_unbounded_or_untested_requirement_are_refused(tmp_path):
    tested = {"transformers": {"5.19.0": ["sglang"], "5.24.0": ["e2e"]}, "torch": {"2.13.0+cpu": ["e2e"]}}
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["plasmid>=0.1", "transformers>=4.45", "torch>=2.13",'
                         ' "numpy>=2"]\n[project.optional-dependencies]\nplot = ["torch"]\n')
    problems = bound_problems(pyproject, tested)
    assert len(problems) == 3, problems
    assert "transformers>=4.45 claims versions older than any CI tested: the oldest tested is 5.19.0 (sglang)" \
        in problems[0]
    assert "numpy>=2 was never tested" in problems[1]
    assert "torch has no lower bound" in problems[2]
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["transformers>=5.19,<5.20", "torch>=2.13.0"]\n')
    assert bound_problems(pyproject, tested) == []
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["transformers>=5.30"]\n')
    assert bound_problems(pyproject, tested) == [f"{pyproject}: transformers>=5.30 admits no version CI tested "
                                                 f"(5.19.0, 5.24.0)"]


def test_the_record_is_written_from_the_tox_envs_and_reads_back(tmp_path):
    tool = _tool()
    for env, pins in {"e2e": {"torch": "2.13.0+cpu", "Foo_Bar": "1.0"}, "sglang": {"torch": "2.14.1"},
                      "lint": {"plasmid-x": "0.1.0"}}.items():
        site = tmp_path / ".tox" / env / "lib" / "python3.11" / "site-packages"
        for name, version in pins.items():
            info = site / f"{name.replace('-', '_')}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n")
    (tmp_path / ".tox" / "discarded" / "lib").mkdir(parents=True)  # site-packages deleted after its tests
    output = tmp_path / "record.txt"
    assert tool.main(["--tox-dir", str(tmp_path / ".tox"), "--output", str(output)]) == 0
    lines = [line for line in output.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["foo-bar==1.0  # e2e", "torch==2.13.0+cpu  # e2e", "torch==2.14.1  # sglang"]
    assert tool.parse(output.read_text()) == {"foo-bar": {"1.0": ["e2e"]},
                                              "torch": {"2.13.0+cpu": ["e2e"], "2.14.1": ["sglang"]}}


def test_a_tox_dir_without_installed_packages_is_one_error_line(tmp_path, capsys):
    (tmp_path / ".tox" / "e2e").mkdir(parents=True)
    assert _tool().main(["--tox-dir", str(tmp_path / ".tox"), "--output", str(tmp_path / "out.txt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("record_tested_versions: error: no tox env under") and "\n" not in err
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("line", ["torch>=2.13", "no pin here  # e2e"])
def test_the_reader_refuses_a_line_that_is_not_a_pin(line):
    with pytest.raises(ValueError, match="is not NAME==VERSION"):
        _tool().parse(line)
