"""The sandbox's supervisor: a stdlib-only script that confines a guest process, times it, and
leaves no process of it behind.

Run by :mod:`plasmid_code.sandbox` as ``python -I -S launcher.py SPEC_JSON`` in a new session,
with a scrubbed environment and the sandbox directory as cwd. It is single-threaded, so the
fork below is safe (unlike a ``preexec_fn`` in a threaded trainer). In order:

1. **Namespaces** (``spec["isolate"]``): ``unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC |
   CLONE_NEWPID)``; when that is refused to a non-root user, ``CLONE_NEWUSER`` is added (the user
   maps to itself); when the IPC or PID namespace alone is refused, the others still apply. A new
   network namespace has only a loopback device, down: no connection can be made, not even to
   127.0.0.1 of the host. The IPC namespace takes SysV shared memory, semaphores and message
   queues of the guest away with it when the run ends.
2. It becomes a *child subreaper* and forks the **init** of the run, which is PID 1 of the new PID
   namespace (the guest sees no other process, and when init exits the kernel kills every process
   left in the namespace). Init is not dumpable (a same-uid guest cannot ptrace it).
3. Init takes its own mount namespace and builds the **minimal root** (``spec["rootfs"]``): a
   tmpfs holding, read-only, only the interpreter's prefixes and the shared libraries
   (``/lib*``, ``/usr/lib*``, ``/etc/ld.so.cache``), a two-line ``/etc/passwd``, ``/dev/null``,
   ``zero``, ``random``, ``urandom``, a fresh ``/proc`` of the PID namespace, and the sandbox
   directory read-write at ``/tmp`` (the guest's cwd); then ``pivot_root`` into it (``chroot``
   where that is refused) and detaches the host's tree. Without a PID namespace, or when the
   root cannot be built, the sandbox directory is bind-mounted over every world-writable
   directory (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``) instead (``private-tmp``).
4. Init forks the guest, which sets its **resource limits** (CPU seconds, address space, file
   size, open files, no core dumps, processes), **drops privileges** when started as root
   (``spec["uid"]``: no supplementary groups, then ``setgid``/``setuid`` to a uid that owns no
   file, so that ``RLIMIT_NPROC``, which root ignores, bounds a fork bomb), sets
   ``no_new_privs`` and execs ``spec["argv"]`` with ``spec["env"]``. Init reaps every orphan and
   reports the guest's exit.
5. The launcher waits for init for at most ``spec["wall_seconds"]`` (or until SIGTERM, which the
   parent sends when the guest writes too much; blocked until then, so it is never lost), then
   kills every process left in the tree and reaps them all before it exits. Init and the guest
   die with their parents (``PR_SET_PDEATHSIG``).

It reports on the status descriptor ``spec["status_fd"]``, one line per event: ``ok LAYERS``
once the guest runs (e.g. ``netns,mountns,ipcns,pidns,rootfs,private-tmp,uid``; written by
init), then one of ``exit N``,
``signal N``, ``timeout`` or ``stopped``; or ``error MESSAGE`` when setup or exec failed (exit 121).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MNT_DETACH = 2
#: statvfs flags that a read-only bind remount must keep (the kernel refuses to clear locked ones).
KEPT_FLAGS = ((0x2, MS_NOSUID), (0x4, MS_NODEV), (0x8, MS_NOEXEC), (0x400, 0x400), (0x800, 0x800),
              (0x1000, MS_RELATIME))
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
#: Shared libraries the interpreter may need, bound read-only into the minimal root (a symlink,
#: such as a merged-/usr ``/lib -> usr/lib``, is recreated as one).
LIBRARY_PATHS = ("/lib", "/lib64", "/lib32", "/libx32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32",
                 "/etc/ld.so.cache")
DEVICES = ("null", "zero", "random", "urandom")
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


def _unshare_layers() -> list[str] | None:
    """Network and mount namespaces, then IPC and PID ones where allowed; None if the first two fail."""
    try:
        _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID), "unshare")
        return ["netns", "mountns", "ipcns", "pidns"]
    except OSError:
        pass
    try:
        _check(_libc.unshare(CLONE_NEWNET | CLONE_NEWNS), "unshare")
    except OSError:
        return None
    layers = ["netns", "mountns"]
    for flag, name in ((CLONE_NEWIPC, "ipcns"), (CLONE_NEWPID, "pidns")):
        try:
            _check(_libc.unshare(flag), "unshare")
            layers.append(name)
        except OSError:
            pass
    return layers


def enter_namespaces() -> list[str]:
    """New network, mount, IPC and PID namespaces (the PID one applies to the next child); the
    layers achieved (none when refused)."""
    uid, gid = os.getuid(), os.getgid()
    layers = _unshare_layers()
    if layers is None:
        try:
            _check(_libc.unshare(CLONE_NEWUSER), "unshare(user)")
        except OSError:
            return []
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        layers = ["userns", *(_unshare_layers() or [])]
        if "mountns" not in layers:
            return layers
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    return layers


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                       flags, data.encode() if data else None), f"mount {source} on {target}")


def _bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    kept = 0
    flags = os.statvfs(source).f_flag
    for statvfs_flag, mount_flag in KEPT_FLAGS:
        if flags & statvfs_flag:
            kept |= mount_flag
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | kept)


def private_tmp(sandbox: str) -> None:
    """Bind the sandbox directory over every world-writable directory."""
    # By descriptor: once one directory is covered, the sandbox's path may no longer resolve.
    handle = os.open(sandbox, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    source = f"/proc/self/fd/{handle}"
    for directory in WORLD_WRITABLE:
        if os.path.isdir(directory) and not os.path.islink(directory):
            _mount(source, directory, None, MS_BIND)
    os.close(handle)


def quota_directory(sandbox: str, disk_bytes: int, uid: int | None, gid: int | None) -> int:
    """Mount a tmpfs of ``disk_bytes`` (and a bounded number of inodes) over the sandbox
    directory, holding a copy of its files: the guest's writable area, which the kernel keeps
    within the quota. Returns a descriptor of it (close-on-exec) to tell afterwards whether it
    filled up."""
    files = {}
    for name in os.listdir(sandbox):
        path = os.path.join(sandbox, name)
        with open(path, "rb") as handle:
            files[name] = (handle.read(), os.stat(path).st_mode & 0o777)
    inodes = max(64, min(1 << 16, disk_bytes // 4096))
    _mount("tmpfs", sandbox, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_bytes},nr_inodes={inodes},mode=0700")
    for name, (data, mode) in files.items():
        path = os.path.join(sandbox, name)
        with open(path, "wb") as handle:
            handle.write(data)
        os.chmod(path, mode)
        if uid is not None:
            os.chown(path, uid, gid if gid is not None else uid)
    if uid is not None:
        os.chown(sandbox, uid, gid if gid is not None else uid)
    return os.open(sandbox, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def quota_filled(fd: int) -> bool:
    """Whether the guest filled its tmpfs (no block or no inode left)."""
    info = os.fstatvfs(fd)
    return info.f_bavail == 0 or info.f_favail == 0


def build_root(rootfs: dict, sandbox: str, uid: int, gid: int) -> None:
    """Make a minimal read-only root in ``rootfs["dir"]`` and move into it (see the module docstring).
    Runs in init, as PID 1 of the new PID namespace, after init unshared its own mount namespace."""
    new = os.path.realpath(rootfs["dir"])
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")

    def inner(path: str) -> str:
        return new + path

    bound: list[str] = []
    paths = sorted({os.path.normpath(path) for path in [*rootfs["binds"], *LIBRARY_PATHS]}, key=len)
    for path in paths:
        if not os.path.lexists(path) or any(path == done or path.startswith(done + "/") for done in bound):
            continue
        os.makedirs(os.path.dirname(inner(path)), exist_ok=True)
        if os.path.islink(path) and os.path.dirname(path) in ("/", "/usr"):
            os.symlink(os.readlink(path), inner(path))
            continue
        real = os.path.realpath(path)
        if os.path.isdir(real):
            os.makedirs(inner(path), exist_ok=True)
        else:
            open(inner(path), "w").close()
        _bind_read_only(real, inner(path))
        bound.append(path)
    for directory in ("/dev", "/proc", "/tmp", "/etc"):
        os.makedirs(inner(directory), exist_ok=True)
    for device in DEVICES:
        if os.path.exists(f"/dev/{device}"):
            open(inner(f"/dev/{device}"), "w").close()
            _mount(f"/dev/{device}", inner(f"/dev/{device}"), None, MS_BIND)
    _write(inner("/etc/passwd"), f"root:x:0:0:root:/:/nonexistent\nsandbox:x:{uid}:{gid}:sandbox:/tmp:/nonexistent\n")
    _write(inner("/etc/group"), f"root:x:0:\nsandbox:x:{gid}:\n")
    _mount("proc", inner("/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(sandbox, inner("/tmp"), None, MS_BIND)
    _mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(new)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is not None and _libc.syscall(number, b".", b".") == 0:
        _check(_libc.umount2(b".", MNT_DETACH), "umount the host root")
    else:
        os.chroot(".")
    os.chdir("/")


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
            _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
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


def run_init(spec: dict, sandbox: str, layers: list[str], status_fd: int) -> None:
    """The run's init: builds the guest's view of the filesystem, starts the guest, reaps every
    orphan until the guest exits, reports ``ok LAYERS`` and the guest's outcome. Never returns."""
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
        workdir = sandbox
        quota_fd = -1
        if "mountns" in layers:
            own_namespace = _libc.unshare(CLONE_NEWNS) == 0  # pivot_root must not move the launcher
            if spec.get("disk_bytes"):
                quota_fd = quota_directory(sandbox, spec["disk_bytes"], spec.get("uid"), spec.get("gid"))
            rootfs = spec.get("rootfs")
            built = False
            if own_namespace and rootfs and "pidns" in layers:
                uid = spec["uid"] if spec.get("uid") is not None else os.getuid()
                gid = spec["gid"] if spec.get("gid") is not None else os.getgid()
                try:
                    build_root(rootfs, sandbox, uid, gid)
                    built = True
                except OSError:
                    os.chdir("/")  # back in the (unchanged, own) mount namespace's root: fall back
            if built:
                layers.append("rootfs")
            else:
                private_tmp(sandbox)
                if own_namespace and "pidns" in layers:  # at least hide the host's processes
                    try:
                        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                    except OSError:
                        pass
            layers.append("private-tmp")
            workdir = "/tmp"
        os.chdir(workdir)
        if spec.get("uid") is not None:
            layers.append("uid")
        pid = start_guest(spec, workdir, layers, status_fd)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        os.write(status_fd, f"error {type(exc).__name__}: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    os.write(status_fd, f"ok {','.join(layers)}\n".encode())
    while True:  # as PID 1, every orphan of the namespace is ours to reap
        try:
            child, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if child == pid:
            break
    if os.WIFSIGNALED(status):
        outcome = f"signal {os.WTERMSIG(status)}"
    else:
        outcome = f"exit {os.waitstatus_to_exitcode(status)}"
    if quota_fd >= 0 and quota_filled(quota_fd):
        os.write(status_fd, b"disk\n")
    os.write(status_fd, f"{outcome}\n".encode())
    os._exit(0)


def launch(spec: dict) -> None:
    status_fd = spec["status_fd"]
    layers: list[str] = []
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # held until supervise() handles it
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0), "prctl(PDEATHSIG)")
        _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        sandbox = os.getcwd()
        if spec["isolate"]:
            layers += enter_namespaces()
        # After the uid map is written (a non-dumpable process may not write its own /proc files).
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
        init = os.fork()
        if init == 0:
            run_init(spec, sandbox, layers, status_fd)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        os.write(status_fd, f"error {type(exc).__name__}: {exc}\n".encode())
        kill_tree()
        os._exit(SETUP_FAILED)
    outcome = supervise(init, spec["wall_seconds"])
    kill_tree()
    if outcome in ("timeout", "stopped"):  # otherwise init has reported the guest's outcome
        os.write(status_fd, f"{outcome}\n".encode())
    os._exit(0)


if __name__ == "__main__":
    import sys

    launch(json.loads(sys.argv[1]))
