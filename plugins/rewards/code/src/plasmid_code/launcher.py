"""The sandbox's supervisor: a stdlib-only script that confines a guest process, times it, and
leaves no process of it behind.

Run by :mod:`plasmid_code.sandbox` as ``python -I -S launcher.py SPEC_JSON`` in a new session,
with a scrubbed environment and the sandbox directory as cwd. It is single-threaded, so the
fork below is safe (unlike a ``preexec_fn`` in a threaded trainer). In order:

1. **Namespaces** (``spec["isolate"]``): ``unshare(CLONE_NEWNET | CLONE_NEWNS)``; when that is
   refused to a non-root user, ``CLONE_NEWUSER`` is added (the user maps to itself). A new
   network namespace has only a loopback device, down: no connection can be made, not even to
   127.0.0.1 of the host. In the new mount namespace the sandbox directory is bind-mounted over
   every world-writable directory (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``), so the
   sandbox is the only place a dropped-privilege guest can write, and it works in ``/tmp``.
2. It becomes a *child subreaper*: every orphan of the guest's process tree (a daemonised fork,
   a ``setsid`` escapee) is re-parented to it rather than to init.
3. It forks the guest, which sets its **resource limits** (CPU seconds, address space, file
   size, open files, no core dumps, processes), **drops privileges** when started as root
   (``spec["uid"]``: no supplementary groups, then ``setgid``/``setuid`` to a uid that owns no
   file, so that ``RLIMIT_NPROC``, which root ignores, bounds a fork bomb), and execs
   ``spec["argv"]`` with ``spec["env"]``.
4. It waits for the guest for at most ``spec["wall_seconds"]`` (or until SIGTERM, which the
   parent sends when the guest writes too much; blocked until then, so it is never lost), then
   kills every process left in the tree and reaps them all before it exits. The guest dies with
   the supervisor (``PR_SET_PDEATHSIG``), should the supervisor itself be killed.

It reports on the status descriptor ``spec["status_fd"]``, one line per event: ``ok LAYERS``
once the guest runs (e.g. ``netns,mountns,private-tmp,uid``), then one of ``exit N``,
``signal N``, ``timeout`` or ``stopped``; or ``error MESSAGE`` when setup or exec failed (exit 121).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Directories any user may write to on a usual Linux; the sandbox is mounted over each.
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
SETUP_FAILED = 121
#: How long the supervisor keeps killing and reaping a stubborn process tree.
CLEANUP_SECONDS = 5.0

_libc = ctypes.CDLL(None, use_errno=True)


class Deadline(Exception):
    """The guest ran past its wall-clock time."""


class Stopped(Exception):
    """The parent asked the guest to stop (SIGTERM)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def enter_namespaces(sandbox: str) -> list[str]:
    """New network and mount namespaces; the layers achieved (none when refused)."""
    uid, gid = os.getuid(), os.getgid()
    try:
        _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS), "unshare")
        layers = ["netns", "mountns"]
    except OSError:
        try:
            _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS), "unshare(user)")
        except OSError:
            return []
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        layers = ["userns", "netns", "mountns"]
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # By descriptor: once one directory is covered, the sandbox's path may no longer resolve.
    handle = os.open(sandbox, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    source = f"/proc/self/fd/{handle}".encode()
    for directory in WORLD_WRITABLE:
        if os.path.isdir(directory) and not os.path.islink(directory):
            _check(_libc.mount(source, directory.encode(), None, MS_BIND, None), f"bind {directory}")
    os.close(handle)
    layers.append("private-tmp")
    return layers


def set_limits(limits: dict[str, int]) -> None:
    def cap(which: int, value: int) -> None:
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_CPU, limits["cpu_seconds"])
    cap(resource.RLIMIT_AS, limits["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, limits["file_bytes"])
    cap(resource.RLIMIT_NOFILE, limits["open_files"])
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NPROC, limits["processes"])


def drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"could not drop privileges to uid {uid}")


def start_guest(spec: dict, workdir: str, layers: list[str], status_fd: int) -> int:
    """Fork and exec the guest; its pid. Raises ``OSError`` with the child's reason if exec failed."""
    report_read, report_write = os.pipe()  # close-on-exec: EOF with no data means exec succeeded
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(report_read)
            os.close(status_fd)  # the guest must not be able to write our status lines
            set_limits(spec["limits"])
            if spec.get("uid") is not None:
                drop_privileges(spec["uid"], spec["gid"])
            # After the uid change (which clears it): die with the supervisor, never outlive it.
            _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
            if os.getppid() != supervisor:
                os._exit(SETUP_FAILED)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            env = {**spec["env"], "HOME": workdir, "TMPDIR": workdir, "PLASMID_SANDBOX_LAYERS": ",".join(layers)}
            os.execve(spec["argv"][0], spec["argv"], env)
        except BaseException as exc:  # noqa: BLE001 - reported through the pipe
            os.write(report_write, f"{type(exc).__name__}: {exc}".encode())
        os._exit(SETUP_FAILED)
    os.close(report_write)
    reason = os.read(report_read, 4096).decode(errors="replace")
    os.close(report_read)
    if reason:
        os.waitpid(pid, 0)
        raise OSError(f"starting {spec['argv'][0]} as the guest failed: {reason}")
    return pid


def child_pids(parent: int) -> list[int]:
    """Pids whose parent is ``parent``, from ``/proc/<pid>/stat``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def kill_tree() -> None:
    """Kill and reap every descendant; orphans come back to us (subreaper) until none is left."""
    me = os.getpid()
    give_up = time.monotonic() + CLEANUP_SECONDS
    while time.monotonic() < give_up:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            continue
        for child in child_pids(me):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.002)


def supervise(pid: int, wall_seconds: float) -> str:
    """Wait for the guest; its outcome as a status line."""

    def on_alarm(signum, frame):
        raise Deadline

    def on_term(signum, frame):
        raise Stopped

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # a SIGTERM sent earlier arrives now
        signal.setitimer(signal.ITIMER_REAL, wall_seconds)
        _, status = os.waitpid(pid, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except Deadline:
        return "timeout"
    except Stopped:
        return "stopped"
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.waitstatus_to_exitcode(status)}"


def launch(spec: dict) -> None:
    status_fd = spec["status_fd"]
    layers: list[str] = []
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # held until supervise() handles it
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl(PDEATHSIG)")
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        sandbox = os.getcwd()
        if spec["isolate"]:
            layers += enter_namespaces(sandbox)
        workdir = "/tmp" if "private-tmp" in layers else sandbox
        os.chdir(workdir)
        if spec.get("uid") is not None:
            layers.append("uid")
        pid = start_guest(spec, workdir, layers, status_fd)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        os.write(status_fd, f"error {type(exc).__name__}: {exc}\n".encode())
        kill_tree()
        os._exit(SETUP_FAILED)
    os.write(status_fd, f"ok {','.join(layers)}\n".encode())
    outcome = supervise(pid, spec["wall_seconds"])
    kill_tree()
    os.write(status_fd, f"{outcome}\n".encode())
    os._exit(0)


if __name__ == "__main__":
    import sys

    launch(json.loads(sys.argv[1]))
