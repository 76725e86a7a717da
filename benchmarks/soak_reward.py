"""A local plasmid plugin for ``benchmarks/soak.py`` (soak support, not a shipped reward).

Provides the reward ``soak-exact``: the exact-match rule of the quickstart (a response equal to
the label, whitespace stripped, scores 1.0), with faults injected at random into its calls:

- with probability ``SOAK_RAISE_P`` the call raises ``RuntimeError``;
- with probability ``SOAK_HANG_P`` it blocks its event loop with ``time.sleep(SOAK_HANG_SECONDS)``
  inside the ``async def`` (the worst kind of hang: nothing on that loop can run meanwhile);
- with probability ``SOAK_HOSTILE_P`` it also hands a hostile answer (:data:`HOSTILE_MATH`,
  :data:`HOSTILE_CODE`: a ``\\boxed{1e50000000}``, 3000 nested braces, a program that rebinds
  builtins or returns an object whose ``__eq__`` always says yes) to the real ``math`` or ``code``
  reward of plasmid-math / plasmid-code, built from the run's plugin lock, in a thread of its own
  (the training process must survive it; the sample itself is scored as usual). Every hostile
  answer is wrong, so the grade must be 0.0, within ``SOAK_HOSTILE_BUDGET`` seconds.

Each injected fault is appended to ``SOAK_FAULT_LOG`` as one JSON line ``{"kind", "pid", "time"}``
(a hostile answer's line also has ``case``, and a second line with the same ``id`` follows with
its ``score`` or ``error`` and ``seconds``), so the soak can tell what it injected from what
plasmid reported. Used as ``--plugins ./benchmarks/soak_reward.py --reward soak-exact``.

:func:`answer` is an agent for ``--generate agent --agent ./benchmarks/soak_reward.py:answer``:
one chat call through the gateway (plain ``urllib``), scored by exact match; it writes the
gateway's address to ``SOAK_GATEWAY_FILE`` so the soak can flood the gateway meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from plasmid import hookimpl
from plasmid.types import Sample

#: Hostile final answers for the ``math`` reward, against the label :data:`MATH_LABEL` (all wrong).
HOSTILE_MATH = {
    "huge-float": r"The answer is \boxed{1e50000000}",
    "power-tower": r"\boxed{9^{9^{9}}}",
    "nested-braces": r"\boxed{" + "{" * 3000 + "8" + "}" * 3000 + "}",
    "space-run": r"\boxed{" + " " * 200_000 + "70}",
    "huge-factorial": r"\boxed{(10^{6})!}",
}
MATH_LABEL = "7"
#: Hostile programs for the ``code`` reward, against the tests of :data:`CODE_LABEL` (all fail them).
HOSTILE_CODE = {
    "eq-always-true": "```python\nclass Yes:\n    def __eq__(self, other):\n        return True\n    "
                      "__hash__ = object.__hash__\n\ndef solve(x):\n    return Yes()\n```",
    "rebound-builtins": "```python\nimport builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
                        "builtins.print = lambda *a, **k: None\nbuiltins.len = lambda x: 0\n"
                        "builtins.isinstance = lambda *a: True\n\ndef solve(x):\n    return x\n```",
    "exit-early": "```python\nimport os, sys\nsys.stdout.write('')\nos._exit(0)\n```",
}
CODE_LABEL = {"asserts": ["assert solve(2) == 4", "assert solve(3) == 9"], "tests": [{"stdin": "2\n", "stdout": "4\n"}]}


class FlakyExact:
    """Exact match with injected faults (see the module docstring); stateless but for its RNG."""

    name = "soak-exact"

    def __init__(self, config: Any) -> None:
        self.config = config
        self.hostile_p = float(os.environ.get("SOAK_HOSTILE_P", "0"))
        self.hostile_budget = float(os.environ.get("SOAK_HOSTILE_BUDGET", "30"))
        self._graders: dict[str, Any] = {}
        # one daemon thread grades them in turn: the answers still queued when the process ends are
        # dropped (the soak counts them superseded), not graded while the interpreter shuts down
        # one hostile answer at a time: none is drawn while another waits or is being graded
        self._hostile: queue.SimpleQueue[tuple[str, str, str]] | None = None
        self._grading = True  # until the worker has built both graders
        self._claim = threading.Lock()
        self._hostile_drawn = 0
        if self.hostile_p > 0:
            self._hostile = queue.SimpleQueue()
            threading.Thread(target=self._hostile_worker, name="soak-hostile", daemon=True).start()
        self._lock = threading.Lock()
        self.raise_p = float(os.environ.get("SOAK_RAISE_P", "0"))
        self.hang_p = float(os.environ.get("SOAK_HANG_P", "0"))
        self.hang_seconds = float(os.environ.get("SOAK_HANG_SECONDS", "3"))
        self.log = os.environ.get("SOAK_FAULT_LOG")
        self.rng = random.Random(os.getpid() ^ int(time.time()))

    def _record(self, kind: str, **extra: Any) -> None:
        if self.log:
            with self._lock, open(self.log, "a") as handle:
                handle.write(json.dumps({"kind": kind, "pid": os.getpid(), "time": time.time(), **extra}) + "\n")

    def _claim_hostile(self) -> bool:
        """Whether a hostile answer may be drawn now (none is queued or being graded); claims the slot."""
        with self._claim:
            if self._grading:
                return False
            self._grading = True
            return True

    def _hostile_worker(self) -> None:
        assert self._hostile is not None
        from plasmid.providers import build

        for family in ("math", "code"):  # built before the first answer is drawn, so its grade is not cut short
            self._graders[family] = build("reward", family, self.config)
        self._grading = False
        while True:
            job = self._hostile.get()
            try:
                self._grade_hostile(*job)
            finally:
                self._grading = False

    def _grade_hostile(self, family: str, case: str, fault_id: str) -> None:
        """Grade one hostile answer with the real ``family`` reward (``math``/``code``); records the
        outcome (runs on the one hostile-grading thread, a fresh event loop per answer)."""
        began = time.monotonic()
        try:
            response, label = (HOSTILE_MATH[case], MATH_LABEL) if family == "math" else (HOSTILE_CODE[case], CODE_LABEL)
            score = asyncio.run(self._graders[family](Sample(prompt="soak", response=response, label=label)))
            outcome: dict[str, Any] = {"score": float(score)}
        except Exception as exc:  # noqa: BLE001 - what the grader did with it is the result
            if "interpreter shutdown" in str(exc):
                return  # the process is ending under the grade (its pools are closed): superseded, not failed
            outcome = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        self._record(f"hostile-{family}", id=fault_id, case=case, seconds=round(time.monotonic() - began, 3),
                     budget=self.hostile_budget, **outcome)

    async def __call__(self, sample: Sample) -> float:
        if self._hostile is not None and self.rng.random() < self.hostile_p and self._claim_hostile():
            self._hostile_drawn += 1
            family = ("math", "code")[self._hostile_drawn % 2]  # in turn
            case = self.rng.choice(sorted(HOSTILE_MATH if family == "math" else HOSTILE_CODE))
            fault_id = uuid.uuid4().hex
            self._record(f"hostile-{family}", id=fault_id, case=case, injected=True)
            self._hostile.put((family, case, fault_id))
        draw = self.rng.random()
        if draw < self.raise_p:
            self._record("reward-raise")
            raise RuntimeError("soak: injected reward failure")
        if draw < self.raise_p + self.hang_p:
            self._record("reward-hang")
            time.sleep(self.hang_seconds)  # blocks the loop on purpose: the fault under test
        label = sample.label
        answers = label if isinstance(label, (list, tuple)) else [label]
        return 1.0 if any(sample.response.strip() == str(answer).strip() for answer in answers) else 0.0


_gateway_written: set[str] = set()


async def answer(session: Any) -> float:
    """The soak's agent (see the module docstring): one chat call, exact match against the label."""
    parts = urllib.parse.urlsplit(session.base_url)
    gateway = f"{parts.scheme}://{parts.netloc}"
    target = os.environ.get("SOAK_GATEWAY_FILE")
    if target and gateway not in _gateway_written:
        _gateway_written.add(gateway)
        with open(target + ".tmp", "w") as handle:
            handle.write(gateway)
        os.replace(target + ".tmp", target)
    body = json.dumps({"model": session.model, "messages": session.messages, "logprobs": True}).encode()
    request = urllib.request.Request(f"{session.base_url}/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {session.api_key}"})

    def call() -> dict[str, Any]:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return json.loads(reply.read())

    reply = await asyncio.to_thread(call)
    content = reply["choices"][0]["message"].get("content") or ""
    return float(content.strip() == str(session.label).strip())


@hookimpl
def plasmid_rewards(register: Callable[..., None]) -> None:
    register("soak-exact", FlakyExact)
