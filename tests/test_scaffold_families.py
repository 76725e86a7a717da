"""``plasmid new-plugin FAMILY NAME`` for every family it scaffolds: the package it writes passes
its own tests, which run the family's contract suite (:mod:`plasmid.testing`; the loss, engine,
trainer and weight-sync suites from plasmid-torch) on the example provider, with the package's ``src`` on
``sys.path`` (installing it with pip and training with it is checked for the reward package in
tests/test_new_plugin.py)."""

from __future__ import annotations

import sys
import tomllib

import pytest
from plasmid_scaffold.templates import FAMILIES, SPECS, write_package

#: The contract suite each family's generated test must subclass.
SUITES = {"reward": "RewardContract", "filter": "FilterContract", "tool": "ToolContract",
          "datasource": "DataSourceContract", "loss": "LossContract", "generate": "GenerateContract",
          "engine": "GeneratorContract", "trainer": "TrainerContract", "weight-sync": "WeightSyncContract",
          "observer": "ObserverContract"}


class Outcomes:
    """A pytest plugin recording every test's outcome in the nested session."""

    def __init__(self) -> None:
        self.reports: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self.reports[report.nodeid] = report.outcome


def run_package_tests(root, module):
    """Run ``root/tests`` in this process with ``root/src`` importable; the outcomes."""
    outcomes = Outcomes()
    sys.path.insert(0, str(root / "src"))
    try:
        code = pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", str(root), "-o", "addopts=",
                            str(root / "tests")], plugins=[outcomes])
    finally:
        sys.path.remove(str(root / "src"))
        for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
            del sys.modules[loaded]
    return code, outcomes.reports


def test_every_family_with_a_scaffold_is_tested_here():
    assert set(FAMILIES) == set(SUITES) == set(SPECS)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_scaffold_passes_its_own_tests_and_contract_suite(tmp_path, family):
    name = f"my-{family}"
    root = write_package(family, name, tmp_path)
    module = "plasmid_" + name.replace("-", "_")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["plasmid"] == {name: f"{module}.plugin"}
    assert project["optional-dependencies"]["test"][0] == "pytest>=9.2"
    impl = family.replace("-", "_")
    test_file = root / "tests" / f"test_my_{impl}_{impl}.py"
    assert f"({SUITES[family]}):" in test_file.read_text()
    code, reports = run_package_tests(root, module)
    assert code == 0, reports
    contract = [node for node in reports if "Contract::" in node]
    own = [node for node in reports if "Contract::" not in node]
    assert len(contract) >= 4 and own, reports
    assert set(reports.values()) <= {"passed", "skipped"}, reports  # loss and trainer skip their critic checks
    assert "passed" in set(reports.values())


def test_a_broken_provider_fails_its_contract_suite(tmp_path):
    """The generated tests can fail: a filter that drops without a reason is caught by the suite."""
    root = write_package("filter", "broken", tmp_path)
    impl = root / "src" / "plasmid_broken" / "filter.py"
    text = impl.read_text()
    assert 'return Verdict(False, f"broken: reward spread' in text
    impl.write_text(text.replace('return Verdict(False, f"broken: reward spread <= {self.min_spread:g}")',
                                 'return Verdict(False, "")'))
    code, reports = run_package_tests(root, "plasmid_broken")
    assert code != 0
    assert reports[next(n for n in reports if n.endswith("test_a_dropped_group_names_its_reason"))] == "failed"


@pytest.mark.parametrize(("family", "old", "new", "failing"), [
    # a generate function whose loss mask is one token short
    ("generate", "sample.loss_mask = [1] * trained + [0] * (len(generated) - trained)",
     "sample.loss_mask = [1] * (trained - 1) + [0] * (len(generated) - trained)",
     "test_a_prompt_becomes_a_finished_consistent_sample"),
    # an observer that closes a file it never opened when a run ends without a start
    ("observer", "    if _observer is not None:\n        observer, _observer = _observer, None\n",
     "    if True:\n        observer, _observer = _observer, None\n", "test_an_end_without_a_start_is_ignored"),
    # a weight sync that forgets the engines' version
    ("weight-sync", "engine.update_weights(bucket, weight_version) for engine",
     "engine.update_weights(bucket, 0) for engine", "test_engines_serve_the_synced_weight_version"),
], ids=["generate", "observer", "weight-sync"])
@pytest.mark.timeout(600)
def test_a_broken_scaffold_fails_its_contract_suite(tmp_path, family, old, new, failing):
    """The generated contract tests can fail: each break is caught by the family's suite."""
    root = write_package(family, "broken", tmp_path)
    impl = root / "src" / "plasmid_broken" / ("plugin.py" if family == "observer" else f"{family.replace('-', '_')}.py")
    text = impl.read_text()
    assert old in text
    impl.write_text(text.replace(old, new))
    code, reports = run_package_tests(root, "plasmid_broken")
    assert code != 0
    assert reports[next(n for n in reports if failing in n)] == "failed"


@pytest.mark.timeout(600)
def test_the_tool_scaffold_calls_its_tool_in_multiturn_rollouts_and_catches_a_tool_that_answers_nothing(tmp_path):
    """The tool package's own tests run its tool in real multi-turn rollouts (plasmid.testing.toolcalls),
    once per tool-call format that can name it; a tool whose answer never reaches the model fails them."""
    root = write_package("tool", "echo", tmp_path)
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert "plasmid-multiturn" in project["optional-dependencies"]["test"]
    code, reports = run_package_tests(root, "plasmid_echo")
    rollouts = {node: outcome for node, outcome in reports.items() if "multiturn_rollout" in node}
    assert code == 0 and len(rollouts) == 3 and set(rollouts.values()) == {"passed"}, reports
    assert {node.rpartition("[")[2] for node in rollouts} == {"tagged]", "chat-template]", "mistral]"}
    impl = root / "src" / "plasmid_echo" / "tool.py"
    impl.write_text(impl.read_text().replace("return text[::-1]", "return ''"))
    code, reports = run_package_tests(root, "plasmid_echo")
    assert code != 0
    assert {outcome for node, outcome in reports.items() if "multiturn_rollout" in node} == {"failed"}
