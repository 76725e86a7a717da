"""The ``code`` reward: the fraction of the label's tests that the response's program passes."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import ClassVar

from plasmid.config import Config
from plasmid.options import Options
from plasmid.types import Sample
from plasmid_code.extract import extract_code
from plasmid_code.labels import Suite, parse_label, same_output
from plasmid_code.options import CodeOptions
from plasmid_code.sandbox import Sandbox, SandboxError, missing_layers, new_nonce
from plasmid_code.verdict import parse_replies, plan_snippet, snippet_passes

log = logging.getLogger("plasmid_code")
SOLUTION = "solution.py"
PLAN = "plan.json"


class CodeReward:
    """``await reward(sample)`` -> passed tests / all tests, in [0, 1].

    The program is :func:`~plasmid_code.extract.extract_code` of the response; the tests come from
    the label (:mod:`plasmid_code.labels`). Each stdin/stdout test is one sandboxed run; all assert
    snippets share one run, and are judged here, outside the sandbox, from the values of their
    expressions (:mod:`plasmid_code.verdict`): the program never sees an expected value. A
    response with no code scores 0 without running anything. A label in the wrong format, or a
    sandbox that cannot start, raises (the run reports it with the plugin's name); the program's
    own failures (errors, time-outs, crashes) only fail tests.
    """

    option_classes: ClassVar[tuple[type[Options], ...]] = (CodeOptions,)

    def __init__(self, config: Config) -> None:
        options = CodeOptions.of(config)
        self.limits = options.limits
        self.sandbox = Sandbox(self.limits, concurrency=options.code_concurrency, python=options.code_python,
                               uid_base=options.code_sandbox_uid)
        self.require_isolation = options.code_require_isolation
        self.layers = self.check_isolation()

    def check_isolation(self) -> tuple[str, ...]:
        """Start a first sandboxed run now and say which isolation layers are in force: one info
        line, or a warning naming the missing ones (``--code-require-isolation full``: an error)."""
        layers = self.sandbox.probe()
        missing = missing_layers(layers)
        described = ",".join(layers) or "none"
        if not missing:
            log.info("reward 'code': sandbox layers %s", described)
        else:
            problem = (f"reward 'code': the sandbox runs with layers {described}, without {','.join(missing)}: the "
                       f"guest may read the host's files (labels, datasets) or see its processes. Run as root with "
                       f"CAP_SYS_ADMIN or where unprivileged user namespaces are allowed (see plasmid-code's README)")
            if self.require_isolation == "full":
                raise SandboxError(problem + "; --code-require-isolation full refuses to start")
            log.warning("%s; --code-require-isolation full makes this an error", problem)
        return layers

    async def __call__(self, sample: Sample) -> float:
        suite = parse_label(sample.label, f"reward 'code' (plasmid-code), sample {sample.index}")
        program = extract_code(sample.response)
        if not program.strip():
            return 0.0
        outcomes = await asyncio.gather(
            *(self._stdio_passes(program, case.stdin, case.stdout) for case in suite.stdio),
            self._asserts_passed(program, suite),
        )
        if any(disk for _, disk in outcomes):
            return 0.0  # a run filled its disk quota: the response fails as a whole
        return sum(passed for passed, _ in outcomes) / suite.size

    async def _stdio_passes(self, program: str, stdin: str, expected: str) -> tuple[int, bool]:
        result = await self.sandbox.run(["stdio", SOLUTION], {SOLUTION: program}, stdin.encode())
        passed = result.finished_cleanly and same_output(result.stdout.decode(errors="replace"), expected)
        return int(passed), result.disk_exceeded

    async def _asserts_passed(self, program: str, suite: Suite) -> tuple[int, bool]:
        if not suite.asserts:
            return 0, False
        verdicts, disk = await self._assert_run(program, suite.asserts)
        return sum(verdicts), disk

    async def assert_verdicts(self, program: str, snippets: list[str]) -> list[bool]:
        """Whether each assert snippet passes, in one sandboxed run: the guest evaluates the
        plan's expressions, and the verdict is made here (:mod:`plasmid_code.verdict`)."""
        verdicts, disk = await self._assert_run(program, snippets)
        return [False] * len(snippets) if disk else verdicts

    async def _assert_run(self, program: str, snippets: list[str]) -> tuple[list[bool], bool]:
        plans = [plan_snippet(snippet) for snippet in snippets]
        nonce = new_nonce()
        files = {SOLUTION: program, PLAN: json.dumps([plan.steps if plan else [] for plan in plans])}
        result = await self.sandbox.run(["asserts", SOLUTION, PLAN], files, f"{nonce}\n".encode())
        replies = parse_replies(result.stdout.decode(errors="replace"), nonce)
        return [snippet_passes(plan, replies.get(index)) for index, plan in enumerate(plans)], result.disk_exceeded
