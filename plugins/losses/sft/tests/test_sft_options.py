"""plasmid-sft's option, and --loss sft choosing --generate sft unless the user chose another."""

from __future__ import annotations

import plasmid_sft.plugin
import pytest
from plasmid_sft.options import SFTOptions

from plasmid import testing
from plasmid.errors import UsageError


def test_a_typed_read_gives_the_declared_default():
    config = testing.make_config(plasmid_sft.plugin)
    assert SFTOptions.of(config).sft_append_stop is True
    assert SFTOptions.of(testing.make_config(plasmid_sft.plugin, sft_append_stop=False)).sft_append_stop is False


def test_a_bad_value_is_a_one_line_usage_error_naming_the_flag():
    with pytest.raises(UsageError, match="--sft-append-stop") as raised:
        testing.make_config(plasmid_sft.plugin, sft_append_stop="maybe")
    assert "\n" not in str(raised.value)


def test_loss_sft_defaults_generate_to_sft_and_a_given_generate_wins(tmp_path):
    from plasmid.startup import start

    run_dir = str(tmp_path / "run")
    assert start(["--loss", "sft", "--run-dir", run_dir]).config.option.generate == "sft"
    assert start(["--loss", "sft", "--generate", "single-turn", "--run-dir", run_dir]).config.option.generate == \
        "single-turn"
    assert start(["--run-dir", run_dir]).config.option.generate == "single-turn"


def test_plasmid_plugins_lists_the_loss_and_the_generate_function():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "plugins"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "plasmid-sft" in proc.stdout and "generate: sft; loss: sft" in proc.stdout
