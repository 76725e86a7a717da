"""``--resume`` and a run's ``config.json`` depend on what the run used (plasmid.app.runlock), not
on the plugins installed: a plugin the run never used may be installed or removed; one it used
that is gone, changed or edited is named (one line, with its distribution and the run's lock),
and ``--resume-allow-changes`` gets past every difference listed. The plugins are real wheels
(tests/lock_plugins.py), installed into directories put on ``sys.path`` and taken off again.

A run here is its start-up and its header (what ``plasmid train`` writes before its first step)
plus one checkpoint; the end-to-end tests at the bottom run ``plasmid train`` itself."""

from __future__ import annotations

import json

import pytest
from lock_plugins import build_filter, installed
from plasmid_e2e import SHORT_RUN, read_metrics, run_plasmid

from plasmid.app.rundir import check_run_dir, write_header
from plasmid.app.start import start
from plasmid.errors import UsageError

pytest.importorskip("plasmid_tasks", reason="the runs are the quickstart's (the embedded env)")
from plasmid_tasks.recipe import prepare_tiny_model

EMBEDDED = "hf,tasks,torchgen,rollout,torchtrain,grpo,sync,match"


@pytest.fixture(scope="module")
def lenfilt(tmp_path_factory):
    """rl-plugin-lenfilt 0.1.0 (plugin and filter ``lenfilt``, ``--lenfilt-max-prompt-tokens``)."""
    return build_filter(tmp_path_factory.mktemp("wheels") / "lenfilt-0.1.0")


def make_run(run_dir, *argv):
    """The run directory ``plasmid train ARGV --run-dir RUN_DIR`` leaves after one checkpoint; its lock."""
    config = start([*argv, "--run-dir", str(run_dir)]).config
    write_header(config)
    prepare_tiny_model(config)   # the recipe's model, <run dir>/model
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    checkpoint = run_dir / "checkpoints" / "step_000000"
    checkpoint.mkdir(parents=True)
    (checkpoint / "meta.json").write_text(json.dumps({"rollout_id": 0, "weight_version": 1}))
    return {entry["name"]: entry for entry in json.loads((run_dir / "plugins.lock.json").read_text())}


def resume(run_dir, *argv):
    """The start-up and run-directory check of ``plasmid train ARGV --run-dir RUN_DIR --resume``."""
    config = start([*argv, "--run-dir", str(run_dir), "--resume"]).config
    check_run_dir(config)
    return config


def differences_listed(run_dir, *argv):
    """The differences a resume with ``argv`` lists (one line), after checking that
    ``--resume-allow-changes`` gets past each of them."""
    with pytest.raises(UsageError) as caught:
        resume(run_dir, *argv)
    message = str(caught.value)
    assert "\n" not in message and message.endswith("or pass --resume-allow-changes")
    resume(run_dir, *argv, "--resume-allow-changes")
    return message


# ------------------------------------------------------------------------------ what the lock records
def test_the_lock_records_the_providers_and_changed_options_each_plugin_gave(tmp_path, lenfilt):
    with installed(lenfilt):
        lock = make_run(tmp_path / "run", "--lenfilt-max-prompt-tokens", "256", "--eps-clip", "0.3")
    assert lock["lenfilt"]["providers"] == {} and lock["lenfilt"]["options"] == ["lenfilt_max_prompt_tokens"]
    assert lock["grpo"]["providers"] == {"loss": ["grpo"]} and "eps_clip" in lock["grpo"]["options"]
    assert lock["match"]["providers"] == {"reward": ["exact"]}
    assert lock["tasks"]["providers"] == {"datasource": ["tasks"]}
    assert "num_rollouts" not in lock["plasmid"]["options"]   # at its default


# ------------------------------------------------------------------------------ plugins the run never used
def test_a_plugin_the_run_did_not_use_may_be_uninstalled(tmp_path, lenfilt):
    run_dir = tmp_path / "run"
    with installed(lenfilt):
        lock = make_run(run_dir)
    assert lock["lenfilt"]["providers"] == {} and lock["lenfilt"]["options"] == []
    config = resume(run_dir, "--config", str(run_dir / "config.json"))   # its options at their defaults
    assert not hasattr(config.option, "lenfilt_max_prompt_tokens")
    resume(run_dir)


def test_a_plugin_installed_after_the_run_does_not_block_its_resume(tmp_path, lenfilt):
    run_dir = tmp_path / "run"
    make_run(run_dir)
    with installed(lenfilt):
        resume(run_dir, "--config", str(run_dir / "config.json"))
        resume(run_dir)


def test_a_plugin_the_run_selected_but_did_not_use_may_be_uninstalled(tmp_path, lenfilt):
    run_dir = tmp_path / "run"
    with installed(lenfilt):
        make_run(run_dir, "--plugins", f"{EMBEDDED},lenfilt")
    resume(run_dir, "--config", str(run_dir / "config.json"))


# ------------------------------------------------------------------------------ plugins the run used
def test_an_option_the_run_set_of_a_plugin_now_gone_is_one_line_naming_plugin_and_lock(tmp_path, lenfilt):
    run_dir = tmp_path / "run"
    with installed(lenfilt):
        make_run(run_dir, "--lenfilt-max-prompt-tokens", "256")
    with pytest.raises(UsageError) as caught:
        start(["--config", str(run_dir / "config.json"), "--run-dir", str(tmp_path / "again")])
    assert str(caught.value) == (
        f"--config {run_dir / 'config.json'}: option 'lenfilt_max_prompt_tokens' (the run set it to 256) is "
        f"declared by plugin 'lenfilt' (distribution rl-plugin-lenfilt 0.1.0), which the run used (its lock: "
        f"{run_dir / 'plugins.lock.json'}), but it is not installed now; install it (pip install "
        f"rl-plugin-lenfilt==0.1.0), or accept the change with --resume-allow-changes")
    listed = differences_listed(run_dir)
    assert "--lenfilt-max-prompt-tokens 256 -> unset" in listed and "plugin lenfilt 0.1.0 -> absent" in listed
    config = resume(run_dir, "--config", str(run_dir / "config.json"), "--resume-allow-changes")
    assert not hasattr(config.option, "lenfilt_max_prompt_tokens")


def test_an_option_the_run_set_of_a_plugin_now_deselected_names_the_fix(tmp_path, lenfilt):
    run_dir = tmp_path / "run"
    with installed(lenfilt):
        make_run(run_dir, "--lenfilt-max-prompt-tokens", "256")
        with pytest.raises(UsageError, match=r"but it is not selected now; select it \(--plugins \.\.\.,lenfilt\)"):
            start(["--config", str(run_dir / "config.json"), "--plugins", EMBEDDED, "--resume"])


def test_a_provider_whose_plugin_is_gone_is_named_and_can_be_let_go(tmp_path, lenfilt, capsys):
    run_dir = tmp_path / "run"
    with installed(lenfilt):
        lock = make_run(run_dir, "--plugins", f"{EMBEDDED},lenfilt", "--filter", "lenfilt")
    assert lock["lenfilt"]["providers"] == {"filter": ["lenfilt"]}
    cfg = str(run_dir / "config.json")
    with pytest.raises(UsageError, match=r"plugins: plugin 'lenfilt' \(distribution rl-plugin-lenfilt 0.1.0\), "
                                         r"which the run used \(its lock: .*plugins.lock.json\), is not installed"):
        start(["--config", cfg, "--resume"])
    with pytest.raises(UsageError, match=r"filter: filter 'lenfilt' is provided by plugin 'lenfilt' "):
        start(["--config", cfg, "--plugins", EMBEDDED, "--resume"])
    capsys.readouterr()
    config = resume(run_dir, "--config", cfg, "--resume-allow-changes")
    assert config.option.filter == []
    warnings = capsys.readouterr().err
    assert warnings.count("plasmid: warning: ") == 2 and "left out (--resume-allow-changes)" in warnings
    listed = differences_listed(run_dir, "--plugins", EMBEDDED)
    assert '--filter ["lenfilt"] -> []' in listed and "plugin lenfilt 0.1.0 -> absent" in listed


def test_another_version_of_a_used_plugin_is_listed(tmp_path, lenfilt):
    newer = build_filter(tmp_path / "lenfilt-0.2.0", version="0.2.0")
    run_dir = tmp_path / "run"
    with installed(lenfilt):
        make_run(run_dir, "--filter", "lenfilt")
    with installed(newer):
        resume(run_dir, "--config", str(run_dir / "config.json"), "--resume-allow-changes")
        assert "plugin lenfilt 0.1.0 -> 0.2.0" in differences_listed(run_dir, "--filter", "lenfilt")


def test_a_used_provider_now_from_another_plugin_or_distribution_is_listed(tmp_path, lenfilt):
    fork = build_filter(tmp_path / "fork", distribution="rl-plugin-lenfilt-fork")       # plugin 'lenfilt'
    other = build_filter(tmp_path / "other", plugin="otherfilt", distribution="rl-plugin-otherfilt",
                         filter_name="lenfilt")                                           # filter 'lenfilt'
    run_dir = tmp_path / "run"
    with installed(lenfilt):
        make_run(run_dir, "--filter", "lenfilt")
    with installed(fork):
        assert ("plugin lenfilt rl-plugin-lenfilt 0.1.0 -> rl-plugin-lenfilt-fork 0.1.0"
                in differences_listed(run_dir, "--filter", "lenfilt"))
    with installed(other):
        listed = differences_listed(run_dir, "--filter", "lenfilt")
    assert "plugin lenfilt 0.1.0 -> absent" in listed
    assert "filter 'lenfilt' from plugin lenfilt -> from plugin otherfilt" in listed


def test_a_local_plugin_file_edited_since_the_run_is_listed(tmp_path):
    mine = tmp_path / "my_reward.py"
    mine.write_text("from plasmid import hookimpl\n\n\nclass One:\n    def __init__(self, config):\n        pass\n\n"
                    "    async def __call__(self, sample):\n        return 1.0\n\n\n@hookimpl\n"
                    "def plasmid_rewards(register):\n    register('mine', One)\n")
    run_dir = tmp_path / "run"
    argv = ["--plugins", f"{EMBEDDED},{mine}", "--reward", "mine"]
    lock = make_run(run_dir, *argv)
    assert len(lock["my_reward"]["sha256"]) == 64 and lock["my_reward"]["providers"] == {"reward": ["mine"]}
    resume(run_dir, *argv)
    mine.write_text(mine.read_text().replace("return 1.0", "return 0.5"))
    listed = differences_listed(run_dir, *argv)
    assert f"plugin my_reward ({mine}): its source changed (sha256 {lock['my_reward']['sha256'][:12]} -> " in listed


def test_a_kernel_of_another_version_is_listed(tmp_path):
    run_dir = tmp_path / "run"
    make_run(run_dir)
    lock = json.loads((run_dir / "plugins.lock.json").read_text())
    lock[0]["version"] = "0.0.1"
    (run_dir / "plugins.lock.json").write_text(json.dumps(lock))
    assert "plugin plasmid 0.0.1 -> " in differences_listed(run_dir)


# ------------------------------------------------------------------------------ end to end
@pytest.mark.timeout(600)
def test_a_trained_run_resumes_after_an_unused_plugin_is_uninstalled_and_a_used_one_is_named(tmp_path, lenfilt):
    env = {"PYTHONPATH": str(lenfilt)}
    unused, used = tmp_path / "unused", tmp_path / "used"
    proc = run_plasmid("train", *SHORT_RUN, "--save-interval", "1", "--run-dir", str(unused), env=env)
    assert proc.returncode == 0, proc.stderr
    proc = run_plasmid("train", "--config", str(unused / "config.json"), "--resume", "--num-rollouts", "3")
    assert proc.returncode == 0, proc.stderr
    assert [m["step"] for m in read_metrics(unused)] == [0, 1, 2]
    proc = run_plasmid("train", *SHORT_RUN, "--lenfilt-max-prompt-tokens", "300", "--run-dir", str(used), env=env)
    assert proc.returncode == 0, proc.stderr
    again = tmp_path / "again"
    proc = run_plasmid("train", "--config", str(used / "config.json"), "--run-dir", str(again))
    assert proc.returncode == 2 and not again.exists()
    assert proc.stderr.strip().splitlines() == [
        f"plasmid: error: --config {used / 'config.json'}: option 'lenfilt_max_prompt_tokens' (the run set it to "
        f"300) is declared by plugin 'lenfilt' (distribution rl-plugin-lenfilt 0.1.0), which the run used (its "
        f"lock: {used / 'plugins.lock.json'}), but it is not installed now; install it (pip install "
        f"rl-plugin-lenfilt==0.1.0), or accept the change with --resume-allow-changes"]

