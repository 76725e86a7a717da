"""The python tool runs model code in the code reward's sandbox: it answers with what the program
printed (and the end of its traceback when it raised); a program stopped by the sandbox (time,
output) is a ToolError saying why; the network and writes outside are refused as for the reward."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import plasmid_code.plugin
import pytest
from plasmid_code.options import CodeOptions, PythonToolOptions
from plasmid_code.sandbox import Limits
from plasmid_code.tool import ERROR_TAIL_CHARS, PythonTool, program_of, tail

from plasmid.protocols import Tool, ToolError
from plasmid.testing import ToolContract, build, make_config, run
from plasmid.types import Sample


def _namespaces_allowed() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


OS_LAYERS = os.geteuid() == 0 and _namespaces_allowed()


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    config = make_config(plasmid_code.plugin, python_tool_timeout=1.0, python_tool_max_output_kb=8)
    return build("tool", "python", plasmid_code.plugin, config=config)


def call(tool: PythonTool, code: str) -> str:
    return run(tool({"code": code}, Sample()))


def test_it_is_a_tool_with_its_own_limits():
    config = make_config(plasmid_code.plugin, python_tool_timeout=2.5, python_tool_memory_mb=128,
                         python_tool_max_output_kb=16, python_tool_concurrency=3, code_processes=4,
                         code_sandbox_uid=62000)
    tool = build("tool", "python", plasmid_code.plugin, config=config)
    assert isinstance(tool, Tool) and tool.name == "python" and "\n" not in tool.description
    assert tool.parameters["required"] == ["code"]
    assert tool.sandbox.limits == Limits(wall_seconds=2.5, cpu_seconds=3, memory_bytes=128 * 1024**2, processes=4,
                                         output_bytes=16 * 1024)
    assert tool.sandbox.concurrency == 3 and tool.sandbox.uid_base == 62000
    assert PythonTool.option_classes == (PythonToolOptions, CodeOptions)


@pytest.mark.timeout(60)
def test_prints_are_the_answer(tool):
    assert call(tool, "print(2 ** 100)\nprint('done')") == f"{2**100}\ndone"
    assert call(tool, "import sys\nprint('a')\nprint('b', file=sys.stderr)\nprint('c')") == "a\nb\nc"
    assert call(tool, "print('  indented  ')\nprint()") == "  indented  "
    assert call(tool, "x = 1") == "(no output)"
    assert call(tool, "```python\nprint(5)\n```") == "5"


@pytest.mark.timeout(60)
def test_an_exception_answers_with_the_output_and_the_traceback(tool):
    answer = call(tool, "print('before')\ndef f():\n    raise ValueError('bad input')\nf()")
    assert answer.startswith("before\nTraceback (most recent call last):\n  File \"program.py\", line 4, in <module>")
    assert answer.endswith("\nValueError: bad input")
    assert "_plasmid_tool_runner" not in answer and "runpy" not in answer
    assert call(tool, "x = (").endswith("SyntaxError: '(' was never closed")
    assert call(tool, "import sys\nprint('x')\nsys.exit(3)") == "x\nSystemExit: 3"
    assert call(tool, "import sys\nsys.exit(0)") == "(no output)"
    assert call(tool, "import os\nos._exit(4)") == "(exit status 4)"
    assert call(tool, "import os\nprint('y', flush=True)\nos._exit(4)") == "y\n(exit status 4)"


@pytest.mark.timeout(60)
def test_the_error_tail_survives_a_long_output(tool):
    answer = call(tool, "print('x' * 5000)\nraise RuntimeError('at the end')")
    assert answer.endswith("\nRuntimeError: at the end")
    deep = call(tool, "def f(n):\n    return f(n + 1)\nf(0)")
    assert deep.endswith("RecursionError: maximum recursion depth exceeded")
    assert len(deep) <= ERROR_TAIL_CHARS + 10


@pytest.mark.timeout(60)
def test_an_infinite_loop_is_stopped_at_the_time_limit(tool):
    started = time.perf_counter()
    with pytest.raises(ToolError) as raised:
        call(tool, "print('started', flush=True)\nwhile True:\n    pass")
    assert time.perf_counter() - started < 10
    assert str(raised.value) == ("the program ran past the time limit of 1 s and was stopped; its output began:\n"
                                 "started\n")


@pytest.mark.timeout(60)
def test_too_much_output_stops_the_program(tool):
    with pytest.raises(ToolError, match="printed more than 8 KiB and was stopped; its output began:\nxxx"):
        call(tool, "while True:\n    print('x' * 1000)")


@pytest.mark.timeout(60)
def test_the_network_and_writes_outside_are_refused(tool):
    answer = call(tool, "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=0.5)\nprint('connected')")
    assert "connected" not in answer and "PermissionError: sandbox: socket" in answer
    answer = call(tool, "open('/outside.txt', 'w').write('x')\nprint('wrote')")
    assert "wrote" not in answer and "PermissionError: sandbox: writing /outside.txt is not allowed" in answer
    assert call(tool, "open('inside.txt', 'w').write('x')\nprint(open('inside.txt').read())") == "x"


@pytest.mark.timeout(60)
@pytest.mark.skipif(not OS_LAYERS, reason="needs root and namespaces")
def test_without_the_guard_the_network_namespace_refuses_the_network():
    config = make_config(plasmid_code.plugin, python_tool_timeout=2.0)
    tool = build("tool", "python", plasmid_code.plugin, config=config)
    tool.sandbox.guard = False
    answer = call(tool, "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\nprint('connected')")
    assert "connected" not in answer and ("OSError" in answer or "unreachable" in answer), answer


@pytest.mark.timeout(60)
def test_calls_run_concurrently_without_blocking_the_loop(tool):
    async def together():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        answers = await asyncio.gather(*(tool({"code": f"import time\ntime.sleep(0.3)\nprint({i})"}, Sample())
                                         for i in range(3)))
        ticking.cancel()
        return answers, ticks

    answers, ticks = run(together())
    assert answers == ["0", "1", "2"]
    assert ticks >= 10


@pytest.mark.parametrize(("arguments", "reason"), [
    ({}, "give the program as a non-empty string"),
    ({"code": ""}, "give the program as a non-empty string"),
    ({"code": 5}, "give the program as a non-empty string"),
    ({"code": "print(1)", "timeout": 5}, "unknown argument 'timeout'"),
    ({"code": "#" * 200_000}, "program too long"),
])
def test_wrong_arguments_are_a_tool_error_without_running_anything(tool, arguments, reason):
    with pytest.raises(ToolError, match=reason):
        run(tool(arguments, Sample()))


def test_the_program_is_the_fenced_block_if_there_is_one():
    assert program_of("print(1)") == "print(1)"
    assert program_of("Here:\n```py\nprint(2)\n```\nthanks") == "print(2)\n"
    assert tail("a\nb\nc\nd", 3) == "...\nd" and tail("abc", 5) == "abc"


class TestPythonToolContract(ToolContract):
    plugin = plasmid_code.plugin
    provider = "python"
    config_options = {"python_tool_timeout": 5.0}
    valid_arguments = [{"code": "print(sum(range(10)))"}]
    invalid_arguments = [{}, {"code": ""}, {"code": 3}]
    concurrency = 2
    call_timeout = 60.0
