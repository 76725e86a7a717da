"""Why a Ray actor died, in one line: :func:`classify` reads the error Ray raised for it.

Ray reports every death of an actor process as a :class:`ray.exceptions.RayActorError` (or, for
a task, as :class:`~ray.exceptions.OutOfMemoryError` / :class:`~ray.exceptions.NodeDiedError`),
whose only record of the cause is its text, built by Ray's GCS and raylet. The kinds told apart:

- ``oom``: Ray's memory monitor killed the worker (``OutOfMemoryError``, or exit type
  ``NODE_OUT_OF_MEMORY`` in the text); or the worker vanished without a word (below) while the
  kernel's OOM killer counted a kill in this machine's memory cgroup (:func:`oom_kills`, passed
  as ``kernel_oom_kills``: how many it counted since the actor started);
- ``signal``: killed by a named signal (Ray names SIGTERM), or gone without a word: Ray only sees
  its connection close ("End of file"), which is what SIGKILL (the kernel's OOM killer sends it)
  and crashes such as SIGSEGV look like;
- ``exit``: the process exited by itself with a status (``os._exit``, ``sys.exit``);
- ``exception``: it crashed with an exception (in its constructor, or a task's error);
- ``node``: its node died (or the node's raylet);
- ``owner``: the process that owned it died;
- ``killed``: ``ray.kill`` ended it;
- ``unavailable``: unreachable for now (not known dead);
- ``unknown``: anything else (the first line of Ray's text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: Where the kernel counts OOM kills of this machine's memory cgroup (v2, then v1).
OOM_COUNTERS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))


@dataclass(frozen=True)
class Death:
    """One actor death: ``kind`` (see the module docstring) and ``cause``, one line for people."""

    kind: str
    cause: str


def classify(exc: BaseException, kernel_oom_kills: int = 0) -> Death:
    """The kind and one-line cause of the death behind ``exc`` (see the module docstring).

    ``kernel_oom_kills``: OOM kills the kernel counted in this machine's memory cgroup while the
    actor lived (0 when unknown); they turn a death without a word into ``oom``."""
    import ray.exceptions as rex

    text = str(exc)
    detail = _after(text, "Worker exit detail:")
    if isinstance(exc, rex.OutOfMemoryError) or "NODE_OUT_OF_MEMORY" in text:
        return Death("oom", f"out of memory: Ray's memory monitor killed it ({_first_sentence(detail or text)})")
    if isinstance(exc, (rex.NodeDiedError, rex.LocalRayletDiedError)) or "its node has died" in text:
        node = re.search(r"Node Id: (\w+)", text)
        return Death("node", "its node died" + (f" (node {node.group(1)[:12]})" if node else ""))
    if isinstance(exc, rex.ActorUnavailableError):
        return Death("unavailable", f"unreachable for now: {_first_sentence(text)}")
    if isinstance(exc, rex.RayTaskError) or (isinstance(exc, rex.RayActorError) and exc.actor_init_failed):
        return Death("exception", f"crashed with an exception: {_root_error(text)}")
    if "killed by `ray.kill`" in text:
        return Death("killed", "ended by ray.kill")
    if "its owner has died" in text:
        return Death("owner", "the process that owned it died")
    signal_name = re.search(r"receives a (SIG[A-Z0-9]+)", text)
    if signal_name:
        return Death("signal", f"killed by {signal_name.group(1)}")
    status = re.search(r"exits with an exit code (-?\d+)", text)
    if status:
        return Death("exit", f"its process exited with status {status.group(1)}")
    if "End of file" in text or "connection error" in text:
        if kernel_oom_kills > 0:
            return Death("oom", f"out of memory: killed without a word while the kernel's OOM killer counted "
                                f"{kernel_oom_kills} kill(s) on this machine")
        return Death("signal", "killed by a signal without a word (SIGKILL, which the kernel's OOM killer sends, "
                               "or a crash such as SIGSEGV)")
    return Death("unknown", _first_line(text) or type(exc).__name__)


def oom_kills() -> int | None:
    """The kernel's count of OOM kills in this machine's memory cgroup, or None where it is not
    readable (no cgroup memory controller, another OS)."""
    for path in OOM_COUNTERS:
        try:
            found = re.search(r"^oom_kill (\d+)$", path.read_text(), re.MULTILINE)
        except OSError:
            continue
        if found:
            return int(found.group(1))
    return None


def oom_kills_since(before: int | None) -> int:
    """OOM kills counted since ``before`` (an earlier :func:`oom_kills`); 0 when either is unknown."""
    now = oom_kills()
    return max(0, now - before) if now is not None and before is not None else 0


def _root_error(text: str) -> str:
    """The last ``SomeError: message`` line of a traceback, else its first line."""
    causes = [line.strip() for line in text.splitlines() if re.match(r"^\s*[\w.]+(Error|Exception|Exit): ", line)]
    return causes[-1] if causes else _first_line(text)


def _after(text: str, marker: str) -> str:
    return text.split(marker, 1)[1].strip() if marker in text else ""


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _first_sentence(text: str) -> str:
    line = _first_line(text)
    return line.split(". ", 1)[0].rstrip(".")
