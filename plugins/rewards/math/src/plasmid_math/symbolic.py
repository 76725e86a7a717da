"""Symbolic equivalence with sympy, under a time limit that a pathological answer cannot escape.

Why a worker process: sympy evaluates eagerly and simplification can run for minutes
(``(x+y+z+1)^{40}`` against ``(x+y+z+2)^{40}``, well within the parser's bounds, which refuse
``9^{9^{9}}`` before sympy computes it); a thread cannot be stopped and ``signal.alarm`` works
only in the main thread (the reward runs in worker threads, off the event loop). So each check
is sent to a long-lived worker process (``python -c ... serve()``, sympy imported and warmed up
once, so that no check's time limit pays for imports), and a worker that does not answer within
the time limit is killed and replaced; the check then counts as "not equal". Workers cap their
own address space (``RLIMIT_AS``).

:class:`SymbolicChecker` is thread-safe; ``workers`` checks run at once, more wait for a free
worker. Results are cached (a group's responses often repeat an answer). The time limit holds
for all the checks of one response together (:class:`SymbolicBudget`).
"""

from __future__ import annotations

import atexit
import cmath
import json
import queue
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

#: How long a fresh worker may take to import sympy and say it is ready.
STARTUP_SECONDS = 60.0
SOURCE_ROOT = str(Path(__file__).resolve().parents[1])


# ------------------------------------------------------------------------------------------ worker side
def expressions_equal(a: str, b: str, tolerance: float) -> bool:
    """Whether plain expressions ``a`` and ``b`` are equal: identical, their difference
    simplifies to 0, or (without free symbols, and unless both are rational numbers, which are
    equal only when identical) their values evaluated to 30 digits agree within ``tolerance``
    relative, or 1e-12 absolute (a numerical zero). Raises for text the parser refuses,
    including a power beyond the bounds (:mod:`plasmid_math.expression`)."""
    import sympy

    from plasmid_math.expression import parse

    left, right = parse(a), parse(b)
    if left == right:
        return True
    if left.is_Rational and right.is_Rational:  # exact: 2^{20} is not 1048577
        return False
    if sympy.simplify(left - right) == 0:
        return True
    if left.free_symbols or right.free_symbols:
        return False
    try:
        x, y = complex(sympy.N(left, 30)), complex(sympy.N(right, 30))
    except (TypeError, ValueError, OverflowError):
        return False
    if not (cmath.isfinite(x) and cmath.isfinite(y)):
        return False
    return abs(x - y) <= tolerance * max(abs(x), abs(y)) + 1e-12


def serve(memory_bytes: int) -> None:
    """The worker loop: one JSON request per line on stdin, one JSON reply per line on stdout."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    expressions_equal("2x", "x+1", 0.0)  # imports sympy and what simplify loads lazily, before saying ready
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply: dict[str, Any] = {"equal": expressions_equal(request["a"], request["b"], request["tolerance"])}
        except Exception as exc:  # noqa: BLE001 - an unparsable answer is "not equal", with the reason
            reply = {"equal": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)


# ------------------------------------------------------------------------------------------ parent side
class _Worker:
    """One worker process, started on first use and after being killed."""

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self.process: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        code = (f"import sys; sys.path.insert(0, {SOURCE_ROOT!r}); "
                f"from plasmid_math.symbolic import serve; serve({self.memory_bytes})")
        process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
        if self._reply(process, STARTUP_SECONDS) is None:
            self._kill(process)
            raise RuntimeError(f"the sympy worker did not start within {STARTUP_SECONDS:.0f}s")
        return process

    @staticmethod
    def _reply(process: subprocess.Popen, timeout: float) -> dict | None:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            return None
        line = process.stdout.readline()
        return json.loads(line) if line else None

    @staticmethod
    def _kill(process: subprocess.Popen) -> None:
        process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    def start(self) -> None:
        """Start the process unless it runs (up to ``STARTUP_SECONDS``, no check's time)."""
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()

    def ask(self, request: dict, timeout: float) -> dict | None:
        """The worker's reply, or None when it took longer than ``timeout`` (it is then killed)."""
        self.start()
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            reply = self._reply(self.process, timeout)
        except (BrokenPipeError, OSError, ValueError):
            reply = None
        if reply is None:
            self.close()
        return reply

    def close(self) -> None:
        if self.process is not None:
            self._kill(self.process)
            self.process = None


class SymbolicChecker:
    """``equal(a, b)`` for plain expressions, each check limited to ``timeout`` seconds;
    ``check(a, b, seconds)`` with a shorter limit; ``budget()`` for the checks of one response.

    :ivar timeouts: how many checks were stopped at the time limit (they count as not equal).
    """

    def __init__(self, timeout: float = 5.0, workers: int = 1, tolerance: float = 1e-6,
                 memory_mb: int = 2048, cache_size: int = 4096) -> None:
        self.timeout = timeout
        self.tolerance = tolerance
        self.timeouts = 0
        self._workers = [_Worker(memory_mb * 1024**2) for _ in range(max(1, workers))]
        self._free: queue.Queue[_Worker] = queue.Queue()
        for worker in self._workers:
            self._free.put(worker)
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._cache_size = cache_size
        atexit.register(self.close)

    def equal(self, a: str, b: str) -> bool:
        """Whether sympy shows ``a`` and ``b`` equal within the full time limit."""
        return self.check(a, b, self.timeout)[0]

    def check(self, a: str, b: str, seconds: float) -> tuple[bool, float]:
        """``(equal, seconds the worker spent)``, the check limited to ``min(seconds, timeout)``
        (waiting for a free worker or for one to start is not counted). A cached result costs 0
        seconds; a check cut short by ``seconds`` is not cached (with more time it might finish)."""
        with self._lock:
            if (a, b) in self._cache:
                self._cache.move_to_end((a, b))
                return self._cache[(a, b)], 0.0
        limit = min(seconds, self.timeout)
        worker = self._free.get()
        try:
            worker.start()
            started = time.monotonic()
            reply = worker.ask({"a": a, "b": b, "tolerance": self.tolerance}, limit)
            spent = time.monotonic() - started
        finally:
            self._free.put(worker)
        equal = bool(reply and reply.get("equal"))
        with self._lock:
            if reply is None:
                self.timeouts += 1
            if reply is not None or limit >= self.timeout:
                self._cache[(a, b)] = equal
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return equal, spent

    def budget(self) -> SymbolicBudget:
        """A fresh :class:`SymbolicBudget` of ``timeout`` seconds, for one response's checks."""
        return SymbolicBudget(self, self.timeout)

    def close(self) -> None:
        """Stop every worker (they restart on the next check)."""
        for worker in self._workers:
            worker.close()


class SymbolicBudget:
    """``budget(a, b)``: :meth:`SymbolicChecker.check` while ``seconds`` of worker time last, then
    "not equal" without asking. One response's checks share one budget, so an answer that makes
    many checks (a list against a list, percentages read two ways) still costs sympy at most
    ``seconds`` in all, not ``seconds`` per check."""

    def __init__(self, checker: SymbolicChecker, seconds: float) -> None:
        self.checker = checker
        self.seconds_left = seconds

    def __call__(self, a: str, b: str) -> bool:
        if self.seconds_left <= 0:
            return False
        equal, spent = self.checker.check(a, b, self.seconds_left)
        self.seconds_left -= spent
        return equal
