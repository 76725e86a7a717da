"""Running untrusted Python in a confined subprocess, from asyncio, without blocking the loop.

Each :meth:`Sandbox.run` gets a fresh temporary directory (its only writable place, also its
``HOME`` and ``TMPDIR``) and a scrubbed environment (``PATH``, locale, one-thread settings:
nothing of the parent's, so no secret leaks). It starts ``launcher.py`` (the supervisor) in a new
session with ``asyncio.create_subprocess_exec``, so the event loop keeps running; the launcher
runs the guest interpreter on ``guest.py``. Isolation comes in layers (see
:mod:`plasmid_code.launcher` and :mod:`plasmid_code.guest`):

- network, mount, IPC and PID namespaces (as root, or through an unprivileged user namespace):
  no network at all, no other process visible, no SysV IPC object outliving the run, and a
  minimal read-only root holding only the interpreter's prefix and shared libraries, with the
  sandbox directory as ``/tmp`` (see :mod:`plasmid_code.launcher`);
- when the parent runs as root, a uid of its own for each run, unique on the host across
  processes (:class:`UidPool`: ``uid_base`` .. ``uid_base + UID_RANGE - 1``, which must belong
  to no user): ``RLIMIT_NPROC`` then holds (root ignores it), the guest can write only to its
  directory, and it cannot read or signal another sandbox's files and processes;
- ``resource`` limits of every guest process: CPU seconds, address space, file size, open files,
  processes;
- a wall-clock limit kept by the launcher, which then kills the guest's whole process tree (it is
  the tree's subreaper, so even a ``setsid`` escapee is found) and reaps it; the output read from
  stdout is capped (more is a failure, and the tree is killed). Should the launcher itself hang,
  its process group is killed from here after a grace period;
- an audit-hook guard inside the guest (sockets, processes, ``ctypes``, writes outside).

Without root and without user namespaces only the rlimits, the time limit and the guard remain.
Run rewards as root, or where user namespaces are allowed, for the full sandbox.

The guest interpreter must be executable by the sandbox uid: the first run probes the candidates
(``python=`` if given, else this interpreter, then ``/usr/bin/python3``, ``/usr/local/bin/python3``)
and keeps the first that starts; none starting is a :class:`SandboxError` that says what to pass.
A candidate is resolved through symlinks (a venv's ``bin/python``) to its real executable, which
runs with its own prefix (``sys.base_prefix``): that prefix is what the minimal root holds, so
packages a program may import must be installed there, not in a venv.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import fcntl
import json
import os
import pwd
import random
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path

LAUNCHER = Path(__file__).with_name("launcher.py")
GUEST = Path(__file__).with_name("guest.py")
GUEST_NAME = "_plasmid_guest.py"
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
#: How many uids from ``uid_base`` the sandboxes of a host share (one per run at a time).
UID_RANGE = 1000
#: What the host asks of a candidate interpreter: its real executable and its prefixes.
INSPECT = "import os, sys; print(os.path.realpath(sys.executable)); print(sys.base_prefix); print(sys.base_exec_prefix)"
#: Extra seconds the launcher gets, past the guest's wall-clock limit, to clean up and exit.
LAUNCHER_GRACE_SECONDS = 5.0
#: The guest's whole environment (plus HOME, TMPDIR and PLASMID_SANDBOX_* set by the launcher).
GUEST_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONIOENCODING": "utf-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


class SandboxError(RuntimeError):
    """The sandbox itself could not run (not the guest's fault): setup failed, no usable Python."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``wall_seconds`` is real time; the others are rlimits of each process."""

    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    memory_bytes: int = 512 * 1024**2
    processes: int = 16
    file_bytes: int = 16 * 1024**2
    open_files: int = 64
    output_bytes: int = 1024**2
    disk_bytes: int = 64 * 1024**2


#: The layers without which a guest can read the host's files or processes (see the README).
FULL_ISOLATION = ("netns", "mountns", "ipcns", "pidns", "rootfs")


def missing_layers(layers: tuple[str, ...] | list[str]) -> list[str]:
    """The layers of :data:`FULL_ISOLATION` not in ``layers``."""
    return [layer for layer in FULL_ISOLATION if layer not in layers]


@dataclass
class RunResult:
    """What one sandboxed run did.

    :ivar stdout: what the guest wrote to stdout (at most ``output_bytes``).
    :ivar returncode: the exit status (negative: killed by that signal), None if we killed it.
    :ivar timed_out: it ran past ``wall_seconds`` and its process group was killed.
    :ivar output_exceeded: it wrote more than ``output_bytes`` and was killed.
    :ivar disk_exceeded: it filled the ``disk_bytes`` of its directory.
    :ivar layers: the isolation layers in force (``userns``, ``netns``, ``mountns``, ``ipcns``,
        ``pidns``, ``rootfs``, ``private-tmp``, ``uid``).
    :ivar uid: the uid the guest ran as (None: this process's own).
    """

    stdout: bytes
    returncode: int | None
    timed_out: bool = False
    output_exceeded: bool = False
    disk_exceeded: bool = False
    seconds: float = 0.0
    layers: tuple[str, ...] = ()
    uid: int | None = None

    @property
    def finished_cleanly(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_exceeded and not self.disk_exceeded


@dataclass
class _LoopState:
    """Per-event-loop state: a queue of free slots (the concurrency limit) and the probe lock."""

    slots: asyncio.Queue
    probe_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sandbox:
    """Runs guest commands under :class:`Limits`; at most ``concurrency`` at once per event loop.

    :param python: the guest interpreter (default: probed, see the module docstring).
    :param uid_base: first of the ``UID_RANGE`` sandbox uids (used only when running as root).
    :param isolate: try network and mount namespaces.
    :param guard: install the guest's audit-hook guard (tests turn it off to test the OS layers).
    """

    def __init__(self, limits: Limits | None = None, *, concurrency: int = 2, python: str | None = None,
                 uid_base: int = 61000, isolate: bool = True, guard: bool = True) -> None:
        self.limits = limits or Limits()
        self.concurrency = max(1, concurrency)
        self.python = python
        self.isolate = isolate
        self.guard = guard
        self.as_root = os.geteuid() == 0
        self.uid_base = uid_base
        self.uids = UidPool(uid_base, UID_RANGE) if self.as_root else None
        self._interpreter: dict[str, dict] = {}
        #: The layers of the probe run (the first run on this interpreter), None before it.
        self.layers: tuple[str, ...] | None = None
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    # ---------------------------------------------------------------------------- public
    async def run(self, mode_args: list[str], files: dict[str, str], stdin: bytes = b"",
                  limits: Limits | None = None) -> RunResult:
        """Write ``files`` into a fresh sandbox directory and run the guest script there as
        ``python -I _plasmid_guest.py *mode_args`` (see :mod:`plasmid_code.guest`), feeding ``stdin``."""
        state = self._state()
        await self._ensure_python(state)
        slot = await state.slots.get()
        try:
            return await self._run_in_slot(slot, mode_args, files, stdin, limits or self.limits)
        finally:
            state.slots.put_nowait(slot)

    def probe(self) -> tuple[str, ...]:
        """Start a first run now, from synchronous code (on an event loop of its own, in a thread:
        the caller may be inside a running loop); the layers in force. Raises :class:`SandboxError`."""
        if self.layers is None:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, self._probe()).result()
        assert self.layers is not None
        return self.layers

    async def _probe(self) -> None:
        await self._ensure_python(self._state())

    # ---------------------------------------------------------------------------- internals
    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._states.get(loop)
        if state is None:
            slots: asyncio.Queue = asyncio.Queue()
            for slot in range(self.concurrency):
                slots.put_nowait(slot)
            state = self._states[loop] = _LoopState(slots)
        return state

    async def _ensure_python(self, state: _LoopState) -> None:
        async with state.probe_lock:
            if self.python is not None and getattr(self, "_probed", None) == self.python:
                return
            candidates = [self.python] if self.python else [sys.executable, *PYTHON_CANDIDATES]
            problems = []
            for candidate in dict.fromkeys(candidates):
                if not candidate or not os.path.exists(candidate):
                    continue
                try:
                    self._interpreter[candidate] = await _inspect(candidate)
                except SandboxError as exc:
                    problems.append(f"{candidate}: {exc}")
                    continue
                self.python = candidate
                probe = Limits(wall_seconds=30.0, cpu_seconds=30)
                try:
                    result = await self._run_in_slot(0, ["stdio", "probe.py"], {"probe.py": "print('ok')"}, b"", probe)
                except SandboxError as exc:
                    problems.append(f"{candidate}: {exc}")
                    continue
                if result.stdout.strip() == b"ok":
                    self._probed = candidate
                    self.layers = result.layers
                    return
                problems.append(f"{candidate}: exited {result.returncode}")
            self.python = None
            raise SandboxError(
                "no Python interpreter could run in the sandbox (" + "; ".join(problems) + "). The sandbox user "
                "must be able to execute it: pass --code-python PATH (e.g. /usr/bin/python3), outside any private "
                "home directory")

    async def _run_in_slot(self, slot: int, mode_args: list[str], files: dict[str, str], stdin: bytes,
                           limits: Limits) -> RunResult:
        lease = self.uids.acquire() if self.uids is not None else None
        uid = lease.uid if lease is not None else None
        assert self.python is not None
        interpreter = self._interpreter[self.python]
        directory = Path(tempfile.mkdtemp(prefix="plasmid-code-"))
        root = Path(tempfile.mkdtemp(prefix="plasmid-root-"))
        status_read, status_write = os.pipe()
        process = None
        started = time.perf_counter()
        try:
            self._prepare(directory, files, uid)
            spec = {
                "status_fd": status_write,
                "isolate": self.isolate,
                "uid": uid,
                "gid": uid,
                "wall_seconds": limits.wall_seconds,
                "limits": {k: v for k, v in asdict(limits).items()
                           if k not in ("wall_seconds", "output_bytes", "disk_bytes")},
                "disk_bytes": limits.disk_bytes,
                "env": {**GUEST_ENV, "PLASMID_SANDBOX_GUARD": "1" if self.guard else "0"},
                "argv": [interpreter["executable"], "-I", GUEST_NAME, *mode_args],
                "rootfs": {"dir": str(root), "binds": interpreter["binds"]},
            }
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(spec),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                cwd=directory, env=dict(GUEST_ENV), start_new_session=True, pass_fds=(status_write,))
            os.close(status_write)
            status_write = -1
            stdout, exceeded = await self._communicate(process, stdin, limits)
            result = self._result(_read_all(status_read).splitlines(), stdout, exceeded, started)
            result.uid = uid
            if "mountns" not in result.layers and _disk_usage(directory) > limits.disk_bytes:
                result.disk_exceeded = True  # no private tmpfs: measured afterwards (see the README)
            return result
        finally:
            if status_write >= 0:
                os.close(status_write)
            os.close(status_read)
            if process is not None:
                await _finish(process)
            shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
            if lease is not None:
                lease.release()

    @staticmethod
    def _prepare(directory: Path, files: dict[str, str], uid: int | None) -> None:
        """The guest script and ``files`` in ``directory``, owned by the sandbox uid, private."""
        (directory / GUEST_NAME).write_bytes(GUEST.read_bytes())
        for name, text in files.items():
            (directory / name).write_text(text)
        if uid is not None:
            for path in [directory, *directory.iterdir()]:
                os.chown(path, uid, uid)
        directory.chmod(0o700)

    @staticmethod
    def _result(status: list[str], stdout: bytes, exceeded: bool, started: float) -> RunResult:
        """The run's outcome from the launcher's status lines (see :mod:`plasmid_code.launcher`)."""
        errors = [line[len("error "):] for line in status if line.startswith("error")]
        if errors or not status or not status[0].startswith("ok"):
            problem = "; ".join(errors) or f"unexpected launcher status {status!r}"
            raise SandboxError(f"the sandbox could not start the guest: {problem}")
        layers = tuple(layer for layer in status[0][len("ok "):].split(",") if layer)
        outcome = status[-1] if len(status) > 1 else "killed"
        kind, _, number = outcome.partition(" ")
        returncode = {"exit": int(number or 0), "signal": -int(number or 0)}.get(kind)
        return RunResult(stdout, returncode, timed_out=kind in ("timeout", "killed"), output_exceeded=exceeded,
                         disk_exceeded="disk" in status, seconds=time.perf_counter() - started, layers=layers)

    async def _communicate(self, process: asyncio.subprocess.Process, stdin: bytes,
                           limits: Limits) -> tuple[bytes, bool]:
        """Feed stdin and read stdout up to the cap until the launcher exits; ``(stdout, exceeded)``.

        The launcher enforces the wall-clock limit; past it plus a grace period (the launcher
        is stuck), its whole process group is killed here."""
        assert process.stdin is not None and process.stdout is not None
        chunks: list[bytes] = []
        size = 0

        async def feed() -> None:
            try:
                process.stdin.write(stdin)
                await process.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                process.stdin.close()

        async def read() -> bool:
            nonlocal size
            exceeded = False
            while chunk := await process.stdout.read(65536):
                if exceeded:
                    continue  # drained to EOF, or the pipe (and the process's wait()) never closes
                chunks.append(chunk)
                size += len(chunk)
                if size > limits.output_bytes:
                    exceeded = True
                    process.send_signal(signal.SIGTERM)  # the launcher kills the guest's tree
            return exceeded

        feeder = asyncio.ensure_future(feed())
        exceeded = False
        try:
            exceeded = await asyncio.wait_for(read(), limits.wall_seconds + LAUNCHER_GRACE_SECONDS)
            await asyncio.wait_for(process.wait(), LAUNCHER_GRACE_SECONDS)
        except TimeoutError:
            _kill_group(process.pid)
        finally:
            feeder.cancel()
        return b"".join(chunks)[: limits.output_bytes], exceeded


async def _finish(process: asyncio.subprocess.Process) -> None:
    """Make sure the launcher is gone and its pipes are closed (so the transport closes too)."""
    _kill_group(process.pid)  # also after the launcher exited: anything left in its group
    if process.returncode is None:
        await process.wait()
    assert process.stdin is not None and process.stdout is not None
    process.stdin.close()
    try:  # every writer is dead: this reaches EOF at once
        await asyncio.wait_for(process.stdout.read(), LAUNCHER_GRACE_SECONDS)
    except TimeoutError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _disk_usage(directory: Path) -> int:
    """Bytes the files under ``directory`` occupy (allocated blocks), symlinks not followed."""
    total = 0
    for parent, dirs, files in os.walk(directory):
        for name in (*dirs, *files):
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _read_all(fd: int) -> str:
    """Everything written to the pipe ``fd`` (all writers are closed by now)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    return data.decode(errors="replace")


async def _inspect(python: str) -> dict:
    """The real executable of ``python`` and the directories its minimal root must hold (its
    prefixes, and the executable's directory where that lies outside them). Run on the host:
    the interpreter is the operator's, not the guest's."""
    try:
        process = await asyncio.create_subprocess_exec(
            python, "-I", "-S", "-c", INSPECT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=dict(GUEST_ENV))
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    except (OSError, TimeoutError) as exc:
        raise SandboxError(f"could not run it ({exc})") from None
    lines = output.decode(errors="replace").splitlines()
    if process.returncode != 0 or len(lines) != 3:
        raise SandboxError(f"it did not describe itself (exit {process.returncode})")
    executable, *prefixes = (os.path.realpath(line) for line in lines)
    binds = list(dict.fromkeys(prefixes))
    if not any(executable.startswith(prefix + os.sep) for prefix in binds):
        binds.append(os.path.dirname(executable))
    return {"executable": executable, "binds": binds}


@dataclass
class UidLease:
    """A sandbox uid held by this process until :meth:`release` (or until it dies)."""

    uid: int
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the lock file drops the flock
            self.fd = -1


class UidPool:
    """Sandbox uids unique on the host, across processes: uid ``u`` is held by whoever holds a
    non-blocking ``flock`` on ``LOCKS/u.lock``, in a directory only root can use. A process that
    dies releases its locks with its descriptors, so a crash leaks no uid.

    :param base: the first uid; ``count`` uids from there must belong to no user.
    :raises SandboxError: a uid of the range belongs to a user, or the lock directory is unsafe.
    """

    def __init__(self, base: int, count: int, directory: str | None = None) -> None:
        check_free_uids(base, count)
        self.base, self.count = base, count
        self.directory = directory or _lock_directory()

    def acquire(self) -> UidLease:
        """A free uid of the range, held until its lease is released; :class:`SandboxError` if all
        ``count`` are held."""
        start = random.randrange(self.count)
        for offset in range(self.count):
            uid = self.base + (start + offset) % self.count
            fd = os.open(os.path.join(self.directory, f"{uid}.lock"),
                         os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue
                raise SandboxError(f"cannot lock sandbox uid {uid} in {self.directory}: {exc}") from None
            return UidLease(uid, fd)
        raise SandboxError(f"all {self.count} sandbox uids from {self.base} are in use on this host; "
                           f"lower --code-concurrency or the number of reward workers")


def _lock_directory() -> str:
    """``/run/plasmid-sandbox`` (else ``$TMPDIR/plasmid-sandbox-uids``), mode 0700, ours; refused
    when it is a symlink, someone else's, or open to others (they could hold our uids)."""
    for parent in ("/run", tempfile.gettempdir()):
        path = os.path.join(parent, "plasmid-sandbox" if parent == "/run" else "plasmid-sandbox-uids")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            continue
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise SandboxError(f"the sandbox uid lock directory {path} must be a directory of uid {os.geteuid()} "
                               f"with mode 0700; remove it")
        return path
    raise SandboxError("no place for the sandbox uid locks (/run and the temporary directory are not writable)")


def check_free_uids(uid_base: int, count: int) -> None:
    """Fail unless uids ``uid_base .. uid_base + count - 1`` belong to no user (their processes
    are killed after each run, and they must own no file)."""
    for user in pwd.getpwall():
        if uid_base <= user.pw_uid < uid_base + count:
            raise SandboxError(
                f"sandbox uid {user.pw_uid} belongs to user {user.pw_name!r}; the sandbox kills every process of "
                f"its uids. Choose a free range of {count} uids with --code-sandbox-uid")


def new_nonce() -> str:
    """An unguessable marker for the asserts harness."""
    return secrets.token_hex(16)
