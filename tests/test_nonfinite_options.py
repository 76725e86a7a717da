"""Non-finite numbers are refused at parse time for every float option of the kernel and the
embedded plugins (``--lr inf`` was accepted, and every step was then refused): one line, exit 2,
nothing written."""

from __future__ import annotations

import warnings

import pytest
from plasmid_e2e import run_plasmid

from plasmid.config import OptionParser
from plasmid.errors import UsageError
from plasmid.options import walk_fields
from plasmid.plugins import PluginManager, Selection, installed_entry_points

EMBEDDED = ("hf,tasks,jsonl,torchgen,agent,multiturn,rollout,match,math,code,remote,dynamic,grpo,ppo,"
            "reinforce-pp,torchtrain,sync,tools,sft,opd")


def float_fields():
    manager = PluginManager()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        manager.load(Selection.parse(EMBEDDED, installed_entry_points()))
    parser = OptionParser()
    manager.addoption(parser)
    return [field for field in walk_fields(parser.option_classes) if field.kind.scalar is float]


FLOAT_FIELDS = float_fields()


def test_there_are_float_options_to_check():
    assert {"lr", "temperature", "rm_timeout"} <= {field.name for field in FLOAT_FIELDS}


@pytest.mark.parametrize("raw", ["inf", "-inf", "Infinity", float("inf"), float("-inf"), "nan", float("nan")])
@pytest.mark.parametrize("field", FLOAT_FIELDS, ids=lambda field: field.flag)
def test_every_float_option_refuses_a_non_finite_value_in_one_line(field, raw):
    with pytest.raises(UsageError) as caught:
        field.convert(raw)
    message = str(caught.value)
    assert message.startswith(f"{field.flag}: expected") and "\n" not in message


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_plasmid_train_with_a_non_finite_lr_exits_2_in_one_line_writing_nothing(tmp_path, value):
    run_dir = tmp_path / "run"
    proc = run_plasmid("train", f"--lr={value}", "--num-rollouts", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("plasmid: error: --lr: expected"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists()
