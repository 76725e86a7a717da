"""What plasmid-verifiers cannot run is refused at start-up, in one line, before the run directory
exists: a rubric with a group-level reward function (verifiers' ``Rubric.score_rollout`` would
stop the run at step 0 with an AssertionError), and a verifiers v1 taskset when the installed verifiers
offers no v1 tasksets (simulated: verifiers 0.3.1 has them, so ``verifiers.v1`` is made unimportable)."""

import sys
import textwrap

import pytest
from plasmid_verifiers import plugin, vf

from plasmid.app.cli import main
from plasmid.errors import UsageError
from plasmid.testing import make_config

GROUP_ENV = '''
import verifiers as vf
from datasets import Dataset


def exact(completion, answer) -> float:
    return 1.0


def distinct(completions, **kwargs) -> list[float]:
    """Group-level, as verifiers documents them: plural parameters, one score per rollout of the group."""
    return [1.0 / len(completions)] * len(completions)


def load_environment() -> vf.Environment:
    rows = [{"question": "1+1=", "answer": "2"}] * 4
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[exact, distinct]))
'''

@pytest.fixture
def modules(tmp_path, monkeypatch):
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "vf_plasmid_group_rubric.py").write_text(textwrap.dedent(GROUP_ENV))
    monkeypatch.syspath_prepend(str(folder))
    vf.load_env.cache_clear()
    yield
    vf.load_env.cache_clear()


@pytest.fixture
def no_v1(monkeypatch):
    """A verifiers without the v1 API: ``verifiers.v1`` (and every module under it) cannot be imported,
    and the v1 fixture taskset is imported afresh (so its own ``import verifiers.v1`` fails)."""
    for name in [name for name in sys.modules if name.startswith("verifiers.v1") or name == "vf_plasmid_v1_sum"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    import verifiers

    monkeypatch.delattr(verifiers, "v1", raising=False)


@pytest.mark.parametrize(("env", "message"), [
    ("vf_plasmid_group_rubric", "--vf-env vf_plasmid_group_rubric: its rubric has group-level reward functions "
                                "(distinct), which verifiers scores only over a whole group"),
    ("vf_plasmid_v1_sum", "--vf-env vf_plasmid_v1_sum is a verifiers v1 taskset, but verifiers 0.3.1 offers no v1 "
                          "tasksets (it lacks verifiers.v1)"),
])
def test_refused_by_plasmid_train_in_one_line_before_the_run_directory(tmp_path, capsys, modules, env, message,
                                                                       request):
    if env == "vf_plasmid_v1_sum":
        request.getfixturevalue("no_v1")
    run_dir = tmp_path / "run"
    code = main(["train", "--datasource", "verifiers", "--vf-env", env, "--run-dir", str(run_dir)])
    last = capsys.readouterr().err.strip().splitlines()[-1]   # (datasets' progress bars come before it)
    assert code == 2 and last.startswith(f"plasmid: error: {message}")
    assert not run_dir.exists(), "refused before the run directory is written"


def test_the_reward_alone_refuses_a_group_rubric_too(tmp_path, modules):
    with pytest.raises(UsageError, match="group-level reward functions"):
        make_config(plugin, run_dir=tmp_path, reward=["verifiers"], vf_env="vf_plasmid_group_rubric")
    with pytest.raises(UsageError, match="group-level reward functions"):
        vf.load_env("vf_plasmid_group_rubric")


def test_a_module_that_is_neither_is_still_told_to_be_installed(tmp_path, modules):
    with pytest.raises(UsageError, match="verifiers could not load it .*is its package installed"):
        vf.load_env("vf_plasmid_not_there")


def test_a_verifiers_that_lacks_part_of_the_v1_api_offers_no_v1_tasksets(monkeypatch):
    import verifiers.v1
    from plasmid_verifiers import v1

    monkeypatch.delattr(verifiers.v1, "Harness")
    with pytest.raises(UsageError, match=r"^verifiers 0\.3\.1 offers no v1 tasksets \(it lacks Harness\)"):
        v1.check_offered()
