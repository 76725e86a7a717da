"""The code options are declared once: a bad value is a one-line error naming its flag, the
typed read gives the declared defaults, and they become the sandbox's limits."""

from __future__ import annotations

import plasmid_code.plugin
import pytest
from plasmid_code.options import CodeOptions
from plasmid_code.reward import CodeReward
from plasmid_code.sandbox import Limits

from plasmid.errors import UsageError
from plasmid.testing import make_config


def test_the_typed_read_gives_the_declared_defaults():
    options = CodeOptions.of(make_config(plasmid_code.plugin))
    assert options == CodeOptions.defaults()
    assert (options.code_timeout, options.code_memory_mb, options.code_processes, options.code_max_output_kb,
            options.code_concurrency, options.code_python, options.code_sandbox_uid) == (
        5.0, 512, 16, 1024, 2, None, 61000)


def test_the_options_become_the_limits_of_one_run():
    options = CodeOptions.of(make_config(plasmid_code.plugin, code_timeout=2.5, code_memory_mb=256,
                                         code_processes=4, code_max_output_kb=64))
    assert options.limits == Limits(wall_seconds=2.5, cpu_seconds=3, memory_bytes=256 * 1024**2, processes=4,
                                    output_bytes=64 * 1024)
    assert CodeOptions.of(make_config(plasmid_code.plugin, code_timeout=0.2)).limits.cpu_seconds == 1


@pytest.mark.parametrize(("bad", "message"), [
    ({"code_timeout": 0.0}, "--code-timeout 0.0: must be > 0"),
    ({"code_memory_mb": 0}, "--code-memory-mb 0: must be >= 1"),
    ({"code_processes": -1}, "--code-processes -1: must be >= 1"),
    ({"code_max_output_kb": 0}, "--code-max-output-kb 0: must be >= 1"),
    ({"code_concurrency": 0}, "--code-concurrency 0: must be >= 1"),
    ({"code_sandbox_uid": 0}, "--code-sandbox-uid 0: must be >= 1"),
    ({"code_memory_mb": "lots"}, "--code-memory-mb: expected int, got 'lots'"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_code.plugin, **bad)
    assert str(raised.value) == message


def test_the_reward_lists_the_options_it_reads():
    assert CodeReward.option_classes == (CodeOptions,)


def test_a_bad_isolation_requirement_is_one_line_and_nothing_is_written(tmp_path):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "plasmid.app.cli", "train", "--reward", "code",
                           "--code-require-isolation", "maybe", "--num-rollouts", "1",
                           "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("plasmid: error:")]
    assert len(error) == 1 and "--code-require-isolation" in error[0] and "maybe" in error[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_the_disk_quota_becomes_the_limit_and_its_bad_value_names_its_flag():
    options = CodeOptions.of(make_config(plasmid_code.plugin, code_disk_mb=8))
    assert options.limits.disk_bytes == 8 * 1024**2
    assert CodeOptions.defaults().code_disk_mb == 64 and CodeOptions.defaults().code_require_isolation == "none"
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_code.plugin, code_disk_mb=0)
    assert str(raised.value) == "--code-disk-mb 0: must be >= 1"
