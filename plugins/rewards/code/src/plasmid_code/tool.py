"""The ``python`` tool: runs model-written Python in the code reward's sandbox and returns its output.

Each call is one :meth:`plasmid_code.sandbox.Sandbox.run` (the same isolation as the ``code``
reward: namespaces, sandbox uid, rlimits, the guest's guard) under the tool's own limits
(``--python-tool-*``, :class:`~plasmid_code.options.PythonToolOptions`). The program is written
to ``program.py`` and run as ``__main__`` by a small runner (:data:`RUNNER`) with an empty stdin;
its stderr goes to its stdout, so warnings and ``print(..., file=sys.stderr)`` are seen in order.

The answer to a call:

- the program finished (exit status 0): its output (trailing newlines removed), or ``(no output)``;
- it raised (or exited with a non-zero status): its output, then the tail of its traceback (the
  runner's own frames removed) or the exit status, so an error is shown even after a long output;
- it was stopped by the sandbox (time limit, output cap, a signal such as the CPU limit): a
  :class:`~plasmid.protocols.ToolError` saying why, with the start of its output.

A sandbox that cannot run at all (:class:`~plasmid_code.sandbox.SandboxError`, e.g. no usable
interpreter) propagates; the generate loop reports it to the model and counts it as a tool error.
"""

from __future__ import annotations

from typing import Any, ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.protocols import ToolError
from plasmid.types import Sample
from plasmid_code.extract import extract_code, has_fence
from plasmid_code.options import CodeOptions, PythonToolOptions
from plasmid_code.sandbox import Sandbox, new_nonce

PROGRAM = "program.py"
RUNNER_NAME = "_plasmid_tool_runner.py"
#: Most characters of model code one call may run.
MAX_CODE_CHARS = 100_000
#: Characters of a traceback kept (its end) in an answer.
ERROR_TAIL_CHARS = 2000
#: Characters of output shown with a stopped program's ToolError (its start).
STOPPED_OUTPUT_CHARS = 2000

#: Run in the guest (after the guard, see :mod:`plasmid_code.guest`) as its ``stdio`` solution: reads
#: the marker from the first line of stdin, runs ``program.py`` as ``__main__`` with stderr on
#: stdout, and on an exception or a non-zero exit writes the marker line and then the traceback
#: (from the program's first frame, without the guard's frames) or the exit status. It ends with
#: ``os._exit`` once the output is flushed, so threads the program left running do not hold the
#: run until its time limit.
RUNNER = '''\
import os
import runpy
import sys
import traceback

PROGRAM = "program.py"
marker = sys.stdin.readline().strip()
sys.stdin = open(os.devnull)
sys.stderr = sys.stdout
sys.argv = [PROGRAM]


def report(text):
    sys.stdout.flush()
    sys.stdout.write("\\n" + marker + "\\n" + text)
    sys.stdout.flush()


try:
    runpy.run_path(PROGRAM, run_name="__main__")
except SystemExit as exc:
    if exc.code is None or exc.code == 0:
        sys.stdout.flush()
        os._exit(0)
    report("SystemExit: %s\\n" % (exc.code,))
    sys.stdout.flush()
    os._exit(1)
except BaseException as exc:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != PROGRAM:
        tb = tb.tb_next
    frames = [frame for frame in traceback.extract_tb(tb) if not frame.filename.endswith("_plasmid_guest.py")]
    text = "".join(["Traceback (most recent call last):\\n"] + traceback.format_list(frames)) if frames else ""
    report(text + "".join(traceback.format_exception_only(type(exc), exc)))
    sys.stdout.flush()
    os._exit(1)
sys.stdout.flush()
os._exit(0)
'''


def program_of(code: str) -> str:
    """The program to run: the fenced block of ``code`` if it is wrapped in a Markdown fence
    (```` ```python ... ``` ````), else ``code`` itself."""
    return extract_code(code) if has_fence(code) else code


def tail(text: str, chars: int) -> str:
    """The last ``chars`` characters of ``text``, cut at a line start when there is one."""
    if len(text) <= chars:
        return text
    cut = text[-chars:]
    newline = cut.find("\n")
    return "...\n" + (cut[newline + 1:] if 0 <= newline < len(cut) - 1 else cut)


def _joined(output: str, error: str) -> str:
    """The output, then the error, each without trailing newlines, one line break between."""
    output, error = output.rstrip("\n"), error.rstrip("\n")
    return f"{output}\n{error}" if output else error


class PythonTool:
    """``await python({"code": "print(2 ** 100)"}, sample)`` -> ``"1267650600228229401496703205376"``.

    Built once per run; calls share one :class:`Sandbox` (at most ``--python-tool-concurrency``
    runs at once per event loop) and keep no other state. Each run waits in the sandbox's
    subprocess, so the event loop keeps serving other rollouts.
    """

    name = "python"
    description = "Run a Python 3 program and return what it prints (its stdout and stderr); no network, no files " \
                  "outside its working directory, a time limit."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "the program; use print() to show results"},
        },
        "required": ["code"],
        "additionalProperties": False,
    }
    option_classes: ClassVar[tuple[type[Options], ...]] = (PythonToolOptions, CodeOptions)

    def __init__(self, config: Config) -> None:
        """Built as ``python(config)``: the limits of ``--python-tool-*``; the interpreter, the
        sandbox uids and the process limit are the code reward's (``--code-python``,
        ``--code-sandbox-uid``, ``--code-processes``)."""
        options = PythonToolOptions.of(config)
        code = CodeOptions.of(config)
        self.options = options
        self.limits = options.limits(processes=code.code_processes)
        self.sandbox = Sandbox(self.limits, concurrency=options.python_tool_concurrency, python=code.code_python,
                               uid_base=code.code_sandbox_uid)

    def program(self, arguments: dict[str, Any]) -> str:
        """The program of a call; :class:`ToolError` with a short reason if the arguments are wrong."""
        if not isinstance(arguments, dict):
            raise ToolError('give the arguments as an object: {"code": "..."}')
        extra = sorted(set(arguments) - {"code"})
        if extra:
            raise ToolError(f"unknown argument{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}; "
                            f"give only \"code\"")
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolError('give the program as a non-empty string: {"code": "print(1 + 1)"}')
        if len(code) > MAX_CODE_CHARS:
            raise ToolError(f"program too long ({len(code)} characters; at most {MAX_CODE_CHARS})")
        return program_of(code)

    async def __call__(self, arguments: dict[str, Any], sample: Sample) -> str:
        program = self.program(arguments)
        marker = f"{new_nonce()}-error"
        result = await self.sandbox.run(["stdio", RUNNER_NAME], {RUNNER_NAME: RUNNER, PROGRAM: program},
                                        f"{marker}\n".encode())
        text = result.stdout.decode(errors="replace")
        output, found, error = text.partition(f"\n{marker}\n")
        if result.timed_out:
            raise ToolError(self._stopped(f"the program ran past the time limit of {self.limits.wall_seconds:g} s "
                                          f"and was stopped", output))
        if result.output_exceeded:
            raise ToolError(self._stopped(f"the program printed more than {self.limits.output_bytes // 1024} KiB "
                                          f"and was stopped", output))
        if found:
            return _joined(output, tail(error, ERROR_TAIL_CHARS))
        if result.returncode is None or result.returncode < 0:
            signal = f" by signal {-result.returncode}" if result.returncode is not None else ""
            raise ToolError(self._stopped(f"the program was killed{signal} (CPU or memory limit?)", output))
        if result.returncode != 0:
            return _joined(output, f"(exit status {result.returncode})")
        return output.rstrip("\n") or "(no output)"

    @staticmethod
    def _stopped(reason: str, output: str) -> str:
        if not output.strip():
            return f"{reason}; it printed nothing"
        shown = output if len(output) <= STOPPED_OUTPUT_CHARS else output[:STOPPED_OUTPUT_CHARS] + "\n..."
        return f"{reason}; its output began:\n{shown}"
