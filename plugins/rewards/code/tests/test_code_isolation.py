"""The guest sees nothing of the host: no other process, no host file, no IPC object that
outlives it, no other sandbox's files or processes; and the in-guest guard holds on its own
against the known ways around audit hooks.

The OS-layer tests run the guest without the guard (so the kernel alone must hold) and need root
or unprivileged user namespaces; where the kernel refuses the namespaces they are skipped with
the reason. The guard tests run without any namespace (``isolate=False``).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from plasmid_code.sandbox import Limits, Sandbox, SandboxError, UidPool

from plasmid.testing import run

REPO = Path(__file__).resolve().parents[4]
AS_ROOT = os.geteuid() == 0


def os_sandbox(guard: bool = False, **limits) -> Sandbox:
    return Sandbox(Limits(**{"wall_seconds": 3.0, "cpu_seconds": 3, **limits}), concurrency=1, guard=guard)


def guest_output(sandbox: Sandbox, program: str) -> tuple[str, set[str]]:
    result = run(sandbox.run(["stdio", "solution.py"], {"solution.py": program}))
    return result.stdout.decode(errors="replace"), set(result.layers)


def _kernel_allows_namespaces() -> bool:
    """Whether this kernel lets us make the sandbox's namespaces (as root, or inside a user
    namespace), asked of ``unshare(1)``, independently of the code under test."""
    for extra in ([], ["--user", "--map-current-user"]):
        try:
            done = subprocess.run(["unshare", *extra, "--net", "--mount", "--ipc", "--pid", "--fork", "true"],
                                  capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if done.returncode == 0:
            return True
    return False


needs_namespaces = pytest.mark.skipif(not _kernel_allows_namespaces(), reason="the kernel refuses PID/IPC/mount "
                                      "namespaces here (needs root or unprivileged user namespaces)")


def assert_layers(got: set[str], *layers: str) -> None:
    """The layers under test were in force (checked after the attack: the attack is the test)."""
    assert set(layers) <= got, f"missing layers {set(layers) - got}"


GUARDS = [pytest.param(False, id="os-layers-only"), pytest.param(True, id="guarded")]


@needs_namespaces
@pytest.mark.parametrize("guard", GUARDS)
def test_the_guest_cannot_see_other_processes_command_lines(guard):
    secret = f"label-{uuid.uuid4().hex}"
    # As `plasmid score --label ...` would: a host process with an expected output in its argv.
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--label", secret])
    try:
        program = ("import os\nfound = []\nfor pid in os.listdir('/proc'):\n"
                   "    try:\n        found.append(open(f'/proc/{pid}/cmdline', 'rb').read().decode())\n"
                   "    except Exception:\n        pass\n"
                   "print(len([p for p in os.listdir('/proc') if p.isdigit()]), ' '.join(found))")
        output, layers = guest_output(os_sandbox(guard), program)
        assert secret not in output
        assert int(output.split()[0]) <= 3  # init, the guest (and nothing else of the host)
        assert_layers(layers, "pidns")
    finally:
        holder.kill()
        holder.wait()


def _host_segments(key: int) -> list[int]:
    found = []
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[0]) == key:
            found.append(int(fields[1]))
    return found


@needs_namespaces
def test_sysv_shared_memory_of_the_guest_is_gone_after_the_run():
    key = 0x5A000000 + int(uuid.uuid4().int % 0xFFFFFF)
    program = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               f"shmid = libc.shmget({key}, 4096, 0o1000 | 0o666)\n"
               "print('created' if shmid >= 0 else f'failed {ctypes.get_errno()}')")
    try:
        output, layers = guest_output(os_sandbox(guard=False), program)
        assert output.strip() == "created"  # the attack itself worked inside
        assert _host_segments(key) == []
        assert_layers(layers, "ipcns")
    finally:
        libc = ctypes.CDLL(None)
        for shmid in _host_segments(key):
            libc.shmctl(shmid, 0, None)  # IPC_RMID: leave no segment behind if the test failed


@pytest.fixture
def host_secret_file():
    """A world-readable file in a world-readable directory outside the repository and /tmp."""
    directory = Path(tempfile.mkdtemp(prefix=".plasmid-code-test-", dir=REPO.parent))
    directory.chmod(0o755)
    secret = f"host-secret-{uuid.uuid4().hex}"
    path = directory / "dataset.jsonl"
    path.write_text(secret)
    path.chmod(0o644)
    yield path, secret
    path.unlink()
    directory.rmdir()


@needs_namespaces
@pytest.mark.parametrize("guard", GUARDS)
def test_the_guest_cannot_read_world_readable_host_files(guard, host_secret_file):
    path, secret = host_secret_file
    project = (REPO / "pyproject.toml").read_text()
    host_users = [line for line in Path("/etc/passwd").read_text().splitlines()
                  if line and not line.startswith("root:")]
    program = ("import sys\n"
               f"for path in [{str(path)!r}, {str(REPO / 'pyproject.toml')!r}, '/etc/passwd', '/etc/shadow']:\n"
               "    try:\n        print(open(path).read())\n    except OSError as exc:\n"
               "        print('no', path, type(exc).__name__)\n"
               "print(sys.executable)")
    output, layers = guest_output(os_sandbox(guard), program)
    assert secret not in output
    assert project.splitlines()[0] not in output
    assert not any(line in output for line in host_users)
    assert "sandbox:x:" in output  # the minimal root's own two-line passwd
    assert_layers(layers, "rootfs")


@needs_namespaces
def test_the_minimal_root_is_read_only_but_tmp_and_cwd_are_writable():
    program = ("import os\nfor path in ['/usr/lib/x', '/etc/x', '/x', '/proc/x']:\n"
               "    try:\n        open(path, 'w')\n        print('wrote', path)\n    except OSError:\n        pass\n"
               "open('/tmp/mine', 'w').write('x')\nopen('here', 'w').write('y')\n"
               "print(os.getcwd(), sorted(os.listdir('/tmp')), sorted(os.listdir('/')))")
    output, layers = guest_output(os_sandbox(guard=False), program)
    assert "wrote" not in output
    cwd, rest = output.split(" ", 1)
    assert cwd == "/tmp" and "'here'" in rest and "'mine'" in rest
    assert "'home'" not in rest and "'work'" not in rest and "'var'" not in rest
    assert_layers(layers, "rootfs")


HOLDER = """
import asyncio, json, sys
from plasmid_code.sandbox import Limits, Sandbox
sandbox = Sandbox(Limits(wall_seconds=15, cpu_seconds=15), concurrency=1, isolate=False, guard=False)
result = asyncio.run(sandbox.run(["stdio", "solution.py"], {"solution.py": sys.argv[1]}))
print(json.dumps({"uid": result.uid, "stdout": result.stdout.decode(), "returncode": result.returncode}))
"""


@pytest.mark.skipif(not AS_ROOT, reason="sandbox uids are used only when running as root")
@pytest.mark.timeout(120)
def test_concurrent_sandboxes_in_two_processes_get_different_uids_and_cannot_touch_each_other():
    rendezvous = Path(tempfile.mkdtemp(prefix="plasmid-rendezvous-"))
    rendezvous.chmod(0o777)
    info = rendezvous / "first.json"
    first = (  # writes a private file, says where it is and who it is, then waits
        "import json, os, time\nopen('private.txt', 'w').write('mine')\n"
        "me = {'pid': os.getpid(), 'cwd': os.getcwd(), 'uid': os.getuid()}\n"
        f"json.dump(me, open({str(info)!r} + '.tmp', 'w'))\n"
        f"os.rename({str(info)!r} + '.tmp', {str(info)!r})\n"
        f"for _ in range(100):\n    if os.path.exists({str(rendezvous / 'done')!r}):\n        break\n"
        "    time.sleep(0.1)\nprint('alive', os.getuid())")
    second = (
        "import json, os, signal, time\n"
        f"while not os.path.exists({str(info)!r}):\n    time.sleep(0.05)\n"
        f"other = json.load(open({str(info)!r}))\nreport = [str(os.getuid())]\n"
        "try:\n    report.append(open(os.path.join(other['cwd'], 'private.txt')).read())\n"
        "except OSError as exc:\n    report.append(type(exc).__name__)\n"
        "try:\n    os.kill(other['pid'], signal.SIGKILL)\n    report.append('killed')\n"
        "except OSError as exc:\n    report.append(type(exc).__name__)\n"
        f"open({str(rendezvous / 'done')!r}, 'w').close()\nprint(' '.join(report))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        processes = [subprocess.Popen([sys.executable, "-c", HOLDER, program], stdout=subprocess.PIPE, env=env)
                     for program in (first, second)]
        outputs = [json.loads(process.communicate(timeout=90)[0]) for process in processes]
    finally:
        for path in rendezvous.iterdir():
            path.unlink()
        rendezvous.rmdir()
    (a, b) = outputs
    assert a["uid"] != b["uid"]
    assert a["stdout"].split() == ["alive", str(a["uid"])] and a["returncode"] == 0
    uid, read, kill = b["stdout"].split()
    assert (int(uid), read, kill) == (b["uid"], "PermissionError", "PermissionError")


def test_uids_are_held_until_released_and_a_full_pool_is_an_error(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    pool = UidPool(71000, 2, directory=str(locks))
    first, second = pool.acquire(), pool.acquire()
    assert {first.uid, second.uid} == {71000, 71001}
    with pytest.raises(SandboxError, match="all 2 sandbox uids"):
        pool.acquire()
    # Another process sees them held too (flock is per open file, across processes).
    probe = ("import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    print('free')\n"
             "except OSError:\n    print('held')")
    held = subprocess.run([sys.executable, "-c", probe, str(locks / f"{first.uid}.lock")], capture_output=True,
                          text=True, timeout=30)
    assert held.stdout.strip() == "held"
    first.release()
    assert pool.acquire().uid == first.uid


def test_an_unsafe_lock_directory_is_refused(tmp_path, monkeypatch):
    open_dir = tmp_path / "plasmid-sandbox-uids"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    monkeypatch.setattr("plasmid_code.sandbox.tempfile.gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr("plasmid_code.sandbox.os.mkdir", _refuse_run_mkdir(os.mkdir))
    with pytest.raises(SandboxError, match="mode 0700"):
        UidPool(71000, 2)


def _refuse_run_mkdir(mkdir):
    def patched(path, *args, **kwargs):
        if str(path).startswith("/run/"):
            raise PermissionError(path)
        return mkdir(path, *args, **kwargs)

    return patched


# ---------------------------------------------------------------------------- the guard alone
@pytest.fixture
def open_directory():
    """A directory anyone may write to, outside the sandbox: only the guard stands in the way."""
    directory = Path(tempfile.mkdtemp(prefix="plasmid-outside-"))
    directory.chmod(0o777)
    yield directory
    for path in directory.iterdir():
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    directory.rmdir()


#: Finds a standard-library extension module's shared library, as an attacker would.
SHARED_LIBRARY = ("import glob, sys\n"
                  "def shared_library(name):\n"
                  "    return [path for entry in sys.path for path in glob.glob(entry + '/' + name + '.*so')][0]\n")
GUARD_BYPASSES = {
    "_posixsubprocess": "import _posixsubprocess\n_posixsubprocess.fork_exec(*([None] * 23))",
    "_posixsubprocess-through-a-spec": "import importlib.machinery as machinery, importlib.util\n"
                                       "spec = machinery.BuiltinImporter.find_spec('_posixsubprocess') or "
                                       "machinery.PathFinder.find_spec('_posixsubprocess')\n"
                                       "module = importlib.util.module_from_spec(spec)\n"
                                       "spec.loader.exec_module(module)\n"
                                       "module.fork_exec(*([None] * 23))",
    "_ctypes": "import _ctypes\nprint('imported')",
    "_xxsubinterpreters-under-another-name": SHARED_LIBRARY + "from importlib import machinery, util\n"
                                             "loader = machinery.ExtensionFileLoader('p._xxsubinterpreters', "
                                             "shared_library('_xxsubinterpreters'))\n"
                                             "module = util.module_from_spec(util.spec_from_loader("
                                             "'p._xxsubinterpreters', loader))\n"
                                             "module.run_string(module.create(), 'import os')",
    "_ctypes-under-another-name": SHARED_LIBRARY + "from importlib import machinery, util\n"
                                  "loader = machinery.ExtensionFileLoader('x._ctypes', shared_library('_ctypes'))\n"
                                  "module = util.module_from_spec(util.spec_from_loader('x._ctypes', loader))\n"
                                  "print('imported', module.dlopen)",
    "extension-written-in-the-directory": SHARED_LIBRARY + "import shutil\nfrom importlib import machinery, util\n"
                                          "shutil.copy(shared_library('_json'), '_json.so')\n"
                                          "loader = machinery.ExtensionFileLoader('_json', '_json.so')\n"
                                          "util.module_from_spec(util.spec_from_loader('_json', loader))",
    "_xxsubinterpreters": "import _xxsubinterpreters\nprint('imported')",
    "open-with-dir_fd": "import os\nfd = os.open(OUTSIDE, os.O_RDONLY)\n"
                        "os.close(os.open('via-dir-fd', os.O_WRONLY | os.O_CREAT, dir_fd=fd))",
    "open-with-O_PATH-dir_fd": "import os\nfd = os.open(OUTSIDE, os.O_PATH)\n"
                               "os.close(os.open('via-o-path', os.O_WRONLY | os.O_CREAT, dir_fd=fd))",
    "mkdir-with-dir_fd": "import os\nfd = os.open(OUTSIDE, os.O_RDONLY)\nos.mkdir('made-dir', dir_fd=fd)",
    "symlink-with-dir_fd": "import os\nfd = os.open(OUTSIDE, os.O_RDONLY)\nos.symlink('/etc', 'link', dir_fd=fd)",
    "rename-into-dir_fd": "import os\nopen('mine', 'w').close()\nfd = os.open(OUTSIDE, os.O_RDONLY)\n"
                          "os.rename('mine', 'moved', dst_dir_fd=fd)",
    "chdir-then-relative-write": "import os\nos.chdir(OUTSIDE)\nopen('after-chdir', 'w').write('x')",
    "fchmod-of-outside-file": "import os\nfd = os.open(OUTSIDE + '/existing', os.O_RDONLY)\nos.chmod(fd, 0o777)",
}


@pytest.mark.parametrize("attack", list(GUARD_BYPASSES), ids=list(GUARD_BYPASSES))
def test_the_guard_refuses_the_known_bypasses(attack, open_directory):
    existing = open_directory / "existing"
    existing.write_text("x")
    existing.chmod(0o644)
    sandbox = Sandbox(Limits(wall_seconds=3, cpu_seconds=3), isolate=False, guard=True, concurrency=1)
    code = GUARD_BYPASSES[attack].replace("OUTSIDE", repr(str(open_directory)))
    indented = code.replace("\n", "\n    ")
    program = (f"try:\n    {indented}\n    print('done')\n"
               "except (PermissionError, ImportError) as exc:\n"
               "    print('refused' if 'sandbox' in str(exc) else f'os {exc}')")
    result = run(sandbox.run(["stdio", "solution.py"], {"solution.py": program}))
    assert result.stdout.decode().strip() == "refused", result.stdout
    assert sorted(path.name for path in open_directory.iterdir()) == ["existing"]
    assert existing.stat().st_mode & 0o777 == 0o644


def test_an_honest_program_still_imports_and_writes_in_its_directory_under_the_guard():
    sandbox = Sandbox(Limits(wall_seconds=3, cpu_seconds=3), isolate=False, guard=True, concurrency=1)
    program = ("import os, tempfile\nos.mkdir('d')\nfd = os.open('d', os.O_RDONLY)\n"
               "os.close(os.open('f', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\nos.rename('d/f', 'g')\n"
               "with tempfile.NamedTemporaryFile(dir='.') as handle:\n    handle.write(b'x')\n"
               "os.chdir('d')\nopen('h', 'w').write('y')\n"
               "import asyncio, subprocess, math, json, collections, decimal, fractions, heapq, bisect, re, itertools\n"
               "print('ok')")
    result = run(sandbox.run(["stdio", "solution.py"], {"solution.py": program}))
    assert result.stdout.strip() == b"ok"


UNPRIVILEGED = """
import asyncio, json
from plasmid_code.sandbox import Limits, Sandbox
sandbox = Sandbox(Limits(wall_seconds=10, cpu_seconds=10), concurrency=1, guard=False)
program = "import os\\nprint(len([p for p in os.listdir('/proc') if p.isdigit()]), sorted(os.listdir('/')))"
result = asyncio.run(sandbox.run(["stdio", "solution.py"], {"solution.py": program}))
print(json.dumps({"layers": result.layers, "stdout": result.stdout.decode()}))
"""


@pytest.mark.skipif(not AS_ROOT or not Path("/usr/bin/setpriv").exists() or not Path("/usr/bin/python3").exists(),
                    reason="needs root (to become an unprivileged user), setpriv and /usr/bin/python3")
@pytest.mark.timeout(120)
def test_without_root_a_user_namespace_gives_the_same_namespaces_and_root():
    """What holds without root: run as ``nobody`` (no capabilities), the sandbox gets its
    namespaces and minimal root through an unprivileged user namespace (no ``uid`` layer)."""
    source = Path(__file__).resolve().parents[1] / "src"
    allowed = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "unshare",
                              "--user", "--map-current-user", "--net", "--mount", "--ipc", "--pid", "--fork", "true"],
                             capture_output=True, timeout=30)
    if allowed.returncode != 0:
        pytest.skip(f"unprivileged user namespaces are disabled here: {allowed.stderr.decode().strip()}")
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3",
                           "-c", UNPRIVILEGED], capture_output=True, text=True, timeout=90, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/", "PYTHONPATH": str(source)})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert {"userns", "netns", "mountns", "ipcns", "pidns", "rootfs"} <= set(report["layers"])
    assert "uid" not in report["layers"]
    count, listing = report["stdout"].split(" ", 1)
    assert int(count) <= 3 and "'work'" not in listing and "'home'" not in listing
