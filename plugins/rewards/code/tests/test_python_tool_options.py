"""The python tool's options are declared once: a bad value is a one-line error naming its flag,
the typed read gives the declared defaults, and they become the sandbox's limits."""

from __future__ import annotations

import plasmid_code.plugin
import pytest
from plasmid_code.options import PythonToolOptions
from plasmid_code.sandbox import Limits

from plasmid.errors import UsageError
from plasmid.testing import make_config


def test_the_typed_read_gives_the_declared_defaults():
    options = PythonToolOptions.of(make_config(plasmid_code.plugin))
    assert options == PythonToolOptions.defaults()
    assert (options.python_tool_timeout, options.python_tool_memory_mb, options.python_tool_max_output_kb,
            options.python_tool_concurrency) == (5.0, 512, 64, 2)


def test_the_options_become_the_limits_of_one_call():
    options = PythonToolOptions.of(make_config(plasmid_code.plugin, python_tool_timeout=0.5,
                                               python_tool_memory_mb=100, python_tool_max_output_kb=2))
    assert options.limits(processes=7) == Limits(wall_seconds=0.5, cpu_seconds=1, memory_bytes=100 * 1024**2,
                                                 processes=7, output_bytes=2048)


@pytest.mark.parametrize(("bad", "message"), [
    ({"python_tool_timeout": 0.0}, "--python-tool-timeout 0.0: must be > 0"),
    ({"python_tool_memory_mb": 0}, "--python-tool-memory-mb 0: must be >= 1"),
    ({"python_tool_max_output_kb": 0}, "--python-tool-max-output-kb 0: must be >= 1"),
    ({"python_tool_concurrency": 0}, "--python-tool-concurrency 0: must be >= 1"),
    ({"python_tool_timeout": "soon"}, "--python-tool-timeout: expected float, got 'soon'"),
])
def test_a_bad_value_is_a_one_line_usage_error_naming_its_flag(bad, message):
    with pytest.raises(UsageError) as raised:
        make_config(plasmid_code.plugin, **bad)
    assert str(raised.value) == message
