"""plasmid-opd's options: defaults, bad values, --loss opd choosing --generate opd and needing a
--teacher-model directory, and --kl-coef refused."""

from __future__ import annotations

from pathlib import Path

import plasmid_opd.loss
import plasmid_opd.plugin
import pytest
from plasmid_opd.options import OPDOptions

from plasmid import testing
from plasmid.errors import UsageError
from plasmid_torch.loss_options import PolicyGradientOptions

TEACHER = str(Path(__file__).parent)


def test_a_typed_read_gives_the_declared_defaults():
    options = OPDOptions.of(testing.make_config(plasmid_opd.plugin, teacher_model=TEACHER))
    assert (options.teacher_model, options.opd_reward_weight) == (TEACHER, 0.0)
    assert plasmid_opd.loss.OPDLoss.option_classes[-1] is OPDOptions
    assert PolicyGradientOptions in plasmid_opd.loss.OPDLoss.option_classes


def test_a_negative_reward_weight_is_a_one_line_usage_error():
    with pytest.raises(UsageError, match="--opd-reward-weight -1.0: must be >= 0") as raised:
        testing.make_config(plasmid_opd.plugin, opd_reward_weight=-1.0, teacher_model=TEACHER)
    assert "\n" not in str(raised.value)


def start(*argv: str):
    from plasmid.startup import start as start_run

    return start_run(list(argv))


def test_loss_opd_defaults_generate_to_opd_and_needs_an_existing_teacher_directory(tmp_path):
    run_dir = ["--run-dir", str(tmp_path / "run")]
    teacher = tmp_path / "teacher"
    with pytest.raises(UsageError, match="--teacher-model is not set"):
        start("--loss", "opd", *run_dir)
    with pytest.raises(UsageError, match=f"--teacher-model {teacher}: no such directory"):
        start("--loss", "opd", "--teacher-model", str(teacher), *run_dir)
    teacher.mkdir()
    assert start("--loss", "opd", "--teacher-model", str(teacher), *run_dir).config.option.generate == "opd"


def test_kl_coef_is_refused_naming_the_loss_term_to_use():
    config = testing.make_config(plasmid_opd.plugin, kl_coef=0.1, teacher_model=TEACHER)
    with pytest.raises(UsageError, match="--loss opd: --kl-coef 0.1 .* --kl-loss-coef"):
        plasmid_opd.loss.OPDLoss(config)


def test_plasmid_plugins_lists_the_loss_and_the_generate_function():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "plugins"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "plasmid-opd" in proc.stdout and "generate: opd; loss: opd" in proc.stdout
