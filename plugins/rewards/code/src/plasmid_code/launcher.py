"""The sandbox's first stage: a tiny stdlib-only script that confines itself, then execs the guest.

Run by :mod:`plasmid_code.sandbox` as ``python -I -S launcher.py SPEC_JSON`` in a new session
(its own process group), with a scrubbed environment and the sandbox directory as cwd. It runs
single-threaded, so nothing here races with other threads (unlike a ``preexec_fn``). In order:

1. **Namespaces** (``spec["isolate"]``): ``unshare(CLONE_NEWNET | CLONE_NEWNS)``; when that is
   refused to a non-root user, ``CLONE_NEWUSER`` is added (the user maps to itself). A new
   network namespace has only a loopback device, down: no connection can be made, not even to
   127.0.0.1 of the host. In the new mount namespace the sandbox directory is bind-mounted over
   every world-writable directory (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``), so the
   sandbox is the only writable place a dropped-privilege guest has, and it works in ``/tmp``.
2. **Resource limits** (``resource.setrlimit``): CPU seconds, address space, file size, open
   files, no core dumps, and processes (``RLIMIT_NPROC``, per user: root ignores it, hence 3).
3. **Privileges** (``spec["uid"]``, only when started as root): supplementary groups dropped,
   then ``setgid``/``setuid`` to a sandbox uid that owns no file and runs nothing else, so
   ``RLIMIT_NPROC`` bounds a fork bomb and the guest can write nowhere but the sandbox.
4. ``execve`` of the guest command with ``spec["env"]``.

It reports on the status descriptor ``spec["status_fd"]`` (closed by the exec): ``ok LAYERS``
(the layers in force, e.g. ``netns,mountns,private-tmp,uid``), or, as the last line,
``error MESSAGE`` followed by exit 121 (setup or exec failed).
With ``--reap UID`` it instead kills every process of that uid (stragglers of a fork bomb that
left the process group), as that uid, and exits.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
#: Directories any user may write to on a usual Linux; the sandbox is mounted over each.
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
SETUP_FAILED = 121

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def enter_namespaces(sandbox: str) -> list[str]:
    """New network and mount namespaces; the layers achieved (may be none)."""
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


def launch(spec: dict) -> None:
    status_fd = spec["status_fd"]
    os.set_inheritable(status_fd, False)
    layers: list[str] = []
    try:
        sandbox = os.getcwd()
        if spec["isolate"]:
            layers += enter_namespaces(sandbox)
        workdir = "/tmp" if "private-tmp" in layers else sandbox
        os.chdir(workdir)
        set_limits(spec["limits"])
        if spec.get("uid") is not None:
            drop_privileges(spec["uid"], spec["gid"])
            layers.append("uid")
        env = {**spec["env"], "HOME": workdir, "TMPDIR": workdir, "PLASMID_SANDBOX_LAYERS": ",".join(layers)}
        argv = spec["argv"]
        if not os.access(argv[0], os.X_OK):
            raise OSError(f"the sandbox user cannot execute {argv[0]}")
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        os.write(status_fd, f"error {type(exc).__name__}: {exc}".encode())
        os._exit(SETUP_FAILED)
    os.write(status_fd, f"ok {','.join(layers)}\n".encode())
    try:
        os.execve(argv[0], argv, env)
    except OSError as exc:  # e.g. EAGAIN: the uid is at its process limit
        os.write(status_fd, f"error exec {argv[0]}: {exc}".encode())
        os._exit(SETUP_FAILED)


def reap(uid: int) -> None:
    """Kill every process of ``uid`` (a sandbox uid), from that uid: ``kill(-1)`` spares the caller."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    for _ in range(100):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return


if __name__ == "__main__":
    if sys.argv[1] == "--reap":
        reap(int(sys.argv[2]))
    else:
        launch(json.loads(sys.argv[1]))
