"""Hostile programs are contained, score 0, and finish quickly; the sandbox leaves nothing behind.

Each hostile program prints ``ok`` only if its attack worked, and the label expects ``ok``: a
contained attack scores 0. Most run twice: with the in-guest guard (the normal setup) and without
it, so that the operating-system layers (namespaces, sandbox uid, rlimits) are shown to hold alone.
Those OS-only runs need root (as CI and the dev machines run); elsewhere they are skipped.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import plasmid_code.plugin
import pytest
from plasmid_code.reward import CodeReward
from plasmid_code.sandbox import Limits, Sandbox

from plasmid.testing import build, make_config, run
from plasmid.types import Sample

REPO = Path(__file__).resolve().parents[4]
AS_ROOT = os.geteuid() == 0


def _namespaces_allowed() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


#: The OS layers in full: root (for the sandbox uid) and network/mount namespaces (a container
#: without CAP_SYS_ADMIN refuses them; the sandbox then relies on the guard).
OS_LAYERS = AS_ROOT and _namespaces_allowed()
EXPECT_OK = {"tests": [{"stdin": "", "stdout": "ok"}]}
GUARDS = [pytest.param(True, id="guarded"),
          pytest.param(False, id="os-layers-only",
                       marks=pytest.mark.skipif(not OS_LAYERS, reason="needs root and namespaces"))]


def hostile_reward(guard: bool, **options) -> CodeReward:
    options = {"code_timeout": 1.0, "code_max_output_kb": 64, **options}
    reward = build("reward", "code", plasmid_code.plugin, config=make_config(plasmid_code.plugin, **options))
    reward.sandbox.guard = guard
    record_uids(reward.sandbox)
    return reward


def timed_score(reward: CodeReward, program: str, label=None) -> tuple[float, float]:
    started = time.perf_counter()
    value = run(reward(Sample(response=program, label=label or EXPECT_OK)))
    return value, time.perf_counter() - started


#: Every sandbox uid this module's runs got (other sandboxes on a shared host use the range too).
USED_UIDS: set[int] = set()


def record_uids(sandbox: Sandbox) -> None:
    if sandbox.uids is not None:
        acquire = sandbox.uids.acquire

        def recording():
            lease = acquire()
            USED_UIDS.add(lease.uid)
            return lease

        sandbox.uids.acquire = recording


def sandbox_uid_processes() -> list[int]:
    """Pids of live processes owned by a sandbox uid these tests ran as."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
            state_line = next(line for line in status.splitlines() if line.startswith("State:"))
            if int(uid_line.split()[1]) in USED_UIDS and "zombie" not in state_line:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("guard", GUARDS)
def test_an_infinite_loop_is_stopped_at_the_time_limit(guard):
    value, seconds = timed_score(hostile_reward(guard), "while True:\n    pass\nprint('ok')")
    assert value == 0.0 and seconds < 5


@pytest.mark.parametrize("guard", GUARDS)
def test_a_sleeping_program_is_stopped_at_the_time_limit(guard):
    value, seconds = timed_score(hostile_reward(guard), "import time\ntime.sleep(60)\nprint('ok')")
    assert value == 0.0 and seconds < 5


@pytest.mark.parametrize("guard", GUARDS)
def test_a_fork_bomb_is_bounded_and_leaves_no_process(guard):
    bomb = "import os\nwhile True:\n    os.fork()\nprint('ok')"
    value, seconds = timed_score(hostile_reward(guard), bomb)
    assert value == 0.0 and seconds < 5
    assert sandbox_uid_processes() == []


@pytest.mark.parametrize("guard", GUARDS)
def test_processes_that_escape_the_session_are_killed_too(guard):
    escape = ("import os, time\n"
              "try:\n"
              "    if os.fork() == 0:\n"
              "        os.setsid()\n"
              "        if os.fork() == 0:\n"
              "            time.sleep(60)\n"
              "        os._exit(0)\n"
              "except OSError:\n"
              "    pass\n"
              "print('ok')")
    value, _ = timed_score(hostile_reward(guard), escape)
    assert value in (0.0, 1.0)  # forking may be refused (guard) or allowed (OS layers); either way:
    assert sandbox_uid_processes() == []


@pytest.mark.skipif(not AS_ROOT, reason="the per-slot sandbox uid exists only when running as root")
def test_the_process_limit_holds_without_the_guard():
    count = ("import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
             "            time.sleep(5)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)")
    reward = hostile_reward(False, code_processes=8)
    result = run(reward.sandbox.run(["stdio", "solution.py"], {"solution.py": count}))
    assert int(result.stdout) < 8
    assert sandbox_uid_processes() == []


@pytest.mark.parametrize("guard", GUARDS)
@pytest.mark.parametrize("program", [
    "data = bytearray(4 * 1024**3)\nprint('ok')",
    "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024**2))\nprint('ok')",
], ids=["one-allocation", "growing"])
def test_a_memory_bomb_fails_fast(guard, program):
    value, seconds = timed_score(hostile_reward(guard), program)
    assert value == 0.0 and seconds < 5


@pytest.mark.parametrize("guard", GUARDS)
def test_writing_into_the_repository_is_refused(guard):
    marker = REPO / f"outside-marker-{uuid.uuid4().hex}"
    try:
        value, _ = timed_score(hostile_reward(guard), f"open({str(marker)!r}, 'w').write('x')\nprint('ok')")
        assert value == 0.0
        assert not marker.exists()
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("guard", GUARDS)
def test_writing_to_tmp_never_reaches_the_real_tmp(guard):
    marker = Path("/tmp") / f"outside-marker-{uuid.uuid4().hex}"
    try:
        reward = hostile_reward(guard)
        value, _ = timed_score(reward, f"open({str(marker)!r}, 'w').write('x')\nprint('ok')")
        assert not marker.exists()
        # With a private /tmp the write lands in the sandbox's own /tmp (and may score); without
        # one, the guard refuses it.
        assert value == 0.0 or "private-tmp" in probe_layers(reward)
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("guard", GUARDS)
def test_files_written_in_the_sandbox_are_removed_afterwards(guard):
    reward = hostile_reward(guard)
    program = "import os\nopen('left-behind.txt', 'w').write('x')\nprint(os.getcwd())"
    result = run(reward.sandbox.run(["stdio", "solution.py"], {"solution.py": program}))
    assert result.returncode == 0
    assert not list(Path("/tmp").glob("plasmid-code-*/left-behind.txt"))


@pytest.fixture
def listening_server():
    """A TCP server on 127.0.0.1 that records every connection it accepts."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connection, address = server.accept()
            except (TimeoutError, OSError):
                continue
            accepted.append(str(address))
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("guard", GUARDS)
def test_no_connection_can_be_made_even_to_localhost(guard, listening_server):
    port, accepted = listening_server
    program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
               f"s.sendall(b'pwned')\nprint('ok')")
    value, seconds = timed_score(hostile_reward(guard), program)
    assert value == 0.0 and seconds < 5
    assert accepted == []


@pytest.mark.parametrize("guard", GUARDS)
def test_secrets_in_the_parents_environment_are_not_visible(guard, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("SECRET_TOKEN", secret)
    label = {"tests": [{"stdin": "", "stdout": secret}]}
    direct = "import os\nprint(os.environ.get('SECRET_TOKEN', 'none'))"
    through_proc = ("import os\n"
                    "for pid in os.listdir('/proc'):\n"
                    "    try:\n"
                    "        data = open(f'/proc/{pid}/environ', 'rb').read()\n"
                    "    except Exception:\n"
                    "        continue\n"
                    "    for entry in data.split(b'\\0'):\n"
                    "        if entry.startswith(b'SECRET_TOKEN='):\n"
                    "            print(entry.split(b'=', 1)[1].decode())\n"
                    "            raise SystemExit(0)\n")
    reward = hostile_reward(guard)
    assert timed_score(reward, direct, label)[0] == 0.0
    assert timed_score(reward, through_proc, label)[0] == 0.0


@pytest.mark.parametrize("guard", GUARDS)
def test_a_flood_of_output_is_cut_and_fails(guard):
    value, seconds = timed_score(hostile_reward(guard), "while True:\n    print('x' * 1000)")
    assert value == 0.0 and seconds < 5


def test_the_guard_refuses_what_the_os_layers_would(tmp_path):
    """Without any OS layer (no namespaces), the guard alone refuses sockets, processes, ctypes
    and writes outside the working directory."""
    sandbox = Sandbox(Limits(wall_seconds=2, cpu_seconds=2), isolate=False, guard=True, concurrency=1)
    outside = tmp_path / "outside.txt"
    attacks = {
        "socket": "import socket\nsocket.socket()",
        "subprocess": "import subprocess\nsubprocess.run(['true'])",
        "fork": "import os\nos.fork()",
        "ctypes": "import ctypes\nctypes.CDLL(None)",
        "write": f"open({str(outside)!r}, 'w')",
        "remove": "import os\nos.remove('/etc/hostname')",
        "kill": "import os\nos.kill(os.getppid(), 0)",
    }
    for name, attack in attacks.items():
        indented = attack.replace("\n", "\n    ")
        program = f"try:\n    {indented}\nexcept (PermissionError, ImportError):\n    print('refused')"
        result = run(sandbox.run(["stdio", "solution.py"], {"solution.py": program}))
        assert result.stdout.strip() == b"refused", name
    assert not outside.exists()


@pytest.mark.skipif(not OS_LAYERS, reason="needs root and namespaces")
def test_as_root_every_os_layer_is_in_force():
    assert probe_layers(hostile_reward(True)) >= {"netns", "mountns", "ipcns", "pidns", "rootfs", "private-tmp", "uid"}


def probe_layers(reward: CodeReward) -> set[str]:
    result = run(reward.sandbox.run(["stdio", "solution.py"], {"solution.py": "print('hi')"}))
    return set(result.layers)


def test_the_event_loop_keeps_running_while_code_runs():
    reward = hostile_reward(True, code_timeout=5.0)

    async def scenario():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.ensure_future(ticker())
        value = await reward(Sample(response="import time\ntime.sleep(0.6)\nprint('ok')", label=EXPECT_OK))
        task.cancel()
        return value, ticks

    value, ticks = run(scenario())
    assert value == 1.0 and ticks >= 20


@pytest.mark.parametrize(("concurrency", "overlapping"), [(1, False), (3, True)])
def test_at_most_code_concurrency_programs_run_at_once(concurrency, overlapping):
    reward = hostile_reward(True, code_timeout=5.0, code_concurrency=concurrency)
    program = "import time\nstart = time.time()\ntime.sleep(0.4)\nprint(start, time.time())"

    async def three_at_once():
        runs = [reward.sandbox.run(["stdio", "solution.py"], {"solution.py": program}) for _ in range(3)]
        return await asyncio.gather(*runs)

    spans = sorted(tuple(map(float, result.stdout.split())) for result in run(three_at_once()))
    overlaps = any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))
    assert overlaps is overlapping


# ---------------------------------------------------------------------------- isolation report, disk quota
def _reward(monkeypatch, isolate: bool, **options):
    import functools

    import plasmid_code.plugin
    import plasmid_code.reward

    from plasmid.testing import build, make_config
    monkeypatch.setattr(plasmid_code.reward, "Sandbox", functools.partial(Sandbox, isolate=isolate))
    return build("reward", "code", plasmid_code.plugin,
                 config=make_config(plasmid_code.plugin, code_timeout=5.0, **options))


def test_a_degraded_sandbox_is_a_warning_at_start_up_and_an_error_when_full_isolation_is_required(
        monkeypatch, caplog):
    """As root without namespaces (a default container): only the uid layer and the guard."""
    import logging
    with caplog.at_level(logging.INFO, logger="plasmid_code"):
        _reward(monkeypatch, isolate=False)
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "without netns,mountns,ipcns,pidns,rootfs" in warnings[0].getMessage()
    from plasmid_code.sandbox import SandboxError
    with pytest.raises(SandboxError, match="--code-require-isolation full"):
        _reward(monkeypatch, isolate=False, code_require_isolation="full")


@pytest.mark.skipif(os.geteuid() != 0, reason="the full set of layers is checked as root")
def test_the_layers_in_force_are_logged_at_start_up(monkeypatch, caplog):
    import logging
    with caplog.at_level(logging.INFO, logger="plasmid_code"):
        reward = _reward(monkeypatch, isolate=True, code_require_isolation="full")
    assert set(reward.layers) >= {"netns", "mountns", "ipcns", "pidns", "rootfs", "uid"}
    assert [record.levelno for record in caplog.records] == [logging.INFO]
    assert "sandbox layers netns,mountns,ipcns,pidns" in caplog.records[0].getMessage()


#: A correct program that also fills the disk in files under the per-file limit, ignoring errors.
DISK_FILLER = """
def add(a, b):
    return a + b
chunk = b"x" * (1 << 20)
for n in range(48):
    try:
        with open(f"fill-{n}", "wb") as handle:
            handle.write(chunk)
    except OSError:
        pass
"""


@pytest.mark.parametrize("isolate", [True, False], ids=["tmpfs", "measured-afterwards"])
def test_filling_the_disk_quota_scores_the_response_0(monkeypatch, isolate):
    from plasmid.types import Sample
    reward = _reward(monkeypatch, isolate=isolate, code_disk_mb=16)
    label = {"asserts": ["assert add(1, 2) == 3"], "tests": [{"stdin": "", "stdout": ""}]}
    assert run(reward(Sample(response=DISK_FILLER, label=label))) == 0.0
    assert run(reward(Sample(response=DISK_FILLER.replace("range(48)", "range(4)"), label=label))) == 1.0
