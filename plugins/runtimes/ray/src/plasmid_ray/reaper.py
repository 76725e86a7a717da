"""A reaper that ends every process of a local Ray cluster plasmid started when the driver goes.

Why: ``ray.init`` starts the head processes (GCS, raylet, log monitor, ...) with
``PR_SET_PDEATHSIG``, so they die with the driver, and the workers die with the raylet; but the
raylet's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) notice their raylet's death,
then block trying to report it to the dead GCS and live on, re-parented to init (verified with
Ray 2.60 after a SIGKILL of the driver: both still there minutes later). A normal
``ray.shutdown()`` can leave them too when the machine is slow.

How: before ``ray.init`` the driver puts a unique marker in its environment
(``PLASMID_RAY_SESSION=<token>``), which every process of the cluster inherits (workers and
agents included: the raylet passes its environment on). It also starts this module as a separate
process in its own session (a SIGKILL or Ctrl-C of the driver's process group does not reach it),
holding the read end of a pipe whose write end only the driver has. When the pipe closes (the
driver exited normally, raised, got SIGTERM or SIGKILL), the reaper gives the processes carrying
the marker :data:`GRACE_SECONDS` to end by themselves, SIGKILLs the rest, and exits. The reaper
itself does not carry the marker in its environment (only on its command line).

Processes are found through ``/proc/<pid>/environ``, which is readable for processes of the same
user (and by root for all), so a reaper never touches a process that did not inherit its token.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

#: The environment variable that marks the processes of one plasmid-started Ray cluster.
MARKER = "PLASMID_RAY_SESSION"
#: Seconds the cluster's processes get to end by themselves once the driver is gone.
GRACE_SECONDS = 2.0


@dataclass
class Reaper:
    """The reaper of one cluster: its ``token`` (the marker's value) and its process."""

    token: str
    process: subprocess.Popen[bytes]

    def release(self) -> None:
        """Tell the reaper the driver is done (after ``ray.shutdown()``): it sweeps and exits.
        The driver does not wait for it."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()


def start_reaper() -> Reaper:
    """Mark this process's environment (inherited by the Ray processes started after this) and
    start the reaper watching this process; call before ``ray.init``."""
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    env = {name: value for name, value in os.environ.items() if name != MARKER}
    process = subprocess.Popen([sys.executable, "-m", "plasmid_ray.reaper", token], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, env=env, start_new_session=True, close_fds=True)
    os.environ[MARKER] = token
    return Reaper(token, process)


def marked_processes(token: str) -> list[int]:
    """Pids of live processes (not zombies) whose environment carries ``MARKER=token``."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def sweep(token: str, grace: float = GRACE_SECONDS) -> list[int]:
    """Wait up to ``grace`` seconds for the marked processes to end, then SIGKILL those left;
    returns the pids killed."""
    deadline = time.monotonic() + grace
    while (left := marked_processes(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def main(argv: list[str]) -> int:
    """``python -m plasmid_ray.reaper TOKEN``: wait for stdin to close, then sweep."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    token = argv[0]
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    sweep(token)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
