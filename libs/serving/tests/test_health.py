"""plasmid_serving.health: the monitor's checks and restarts, one look at a time (its thread is
not started: ``check`` is called directly), on fake servers (serving_fakes)."""

from __future__ import annotations

import time

import pytest
from serving_fakes import NAMES, FakeProcess, FakeServer

import plasmid_serving.health
from plasmid.errors import ProviderError
from plasmid_serving.health import HealthMonitor, HealthPolicy
from plasmid_serving.pool import Server


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch):
    """A silent fake server fails a health check after 0.5 s, not 30."""
    monkeypatch.setattr(plasmid_serving.health, "CHECK_TIMEOUT", 0.5)


@pytest.fixture
def launched(tmp_path):
    process = FakeProcess(tmp_path / "server-0.log")
    process.start()
    server = Server(0, NAMES, process=process)
    server.healthy.set()
    yield server
    process.stop()


def monitor(servers, restored, *, failures=2, max_restarts=2, watch_attached=True):
    def restore(server, old_url):
        restored.append((server.index, old_url, server.url))

    return HealthMonitor(servers, HealthPolicy("/health", failures_before_restart=failures,
                                               watch_attached=watch_attached, stop_grace=1.0),
                         interval=60, max_restarts=max_restarts, startup_timeout=30, restore=restore)


def test_a_healthy_server_stays_in_service(launched):
    restored = []
    watcher = monitor([launched], restored)
    watcher.check(launched)
    assert launched.healthy.is_set() and watcher.failures[0] == 0 and restored == []


def test_failed_checks_mark_a_server_down_then_a_restart_brings_it_back_with_its_weights(launched, capfd):
    restored = []
    watcher = monitor([launched], restored, failures=2)
    first, old_url = launched.process.server, launched.url
    first.silent = True
    watcher.check(launched)
    assert not launched.healthy.is_set() and launched.suspect_since is not None and watcher.failures[0] == 1
    assert launched.restarts == 0 and launched.process.server is first
    watcher.check(launched)
    assert launched.restarts == 1 and launched.healthy.is_set() and launched.suspect_since is None
    assert launched.process.server is not first and launched.url != old_url
    assert restored == [(0, old_url, launched.url)]
    report = capfd.readouterr().err
    assert "2 health checks in a row failed; restarting it (restart 1 of 2)" in report and "is back" in report


def test_a_server_whose_process_exited_is_restarted_at_the_first_look(launched, capfd):
    restored = []
    watcher = monitor([launched], restored, failures=5)
    launched.process.kill()
    watcher.check(launched)
    assert launched.restarts == 1 and launched.healthy.is_set() and len(restored) == 1
    assert "its process exited (code -9); restarting it" in capfd.readouterr().err


def test_after_max_restarts_a_dead_server_is_out_of_service(launched):
    watcher = monitor([launched], [], max_restarts=1)
    launched.process.kill()
    watcher.check(launched)
    launched.process.kill()
    watcher.check(launched)
    assert launched.restarts == 1 and not launched.healthy.is_set()
    assert "restarted 1 times already (--fake-max-restarts 1)" in launched.failure
    with pytest.raises(ProviderError, match="out of service: its process exited"):
        launched.check_usable()


def test_a_restart_that_fails_or_a_restore_that_fails_puts_the_server_out_of_service(launched, tmp_path):
    launched.process.fail_starts = 1
    launched.process.kill()
    monitor([launched], []).check(launched)
    assert launched.failure == "the restart failed: RuntimeError: the fake server would not start"

    other = Server(1, NAMES, process=FakeProcess(tmp_path / "server-1.log"))
    other.process.start()
    try:
        def refuse(server, old_url):
            raise ProviderError("its weights cannot be restored")

        watcher = HealthMonitor([other], HealthPolicy("/health"), interval=60, max_restarts=3, startup_timeout=30,
                                restore=refuse)
        other.process.kill()
        watcher.check(other)
        assert other.failure == "the restart failed: ProviderError: its weights cannot be restored"
        assert not other.healthy.is_set()
    finally:
        other.process.stop()


def test_an_attached_server_that_stops_answering_is_put_out_of_service_not_restarted():
    fake = FakeServer()
    fake.start()
    try:
        server = Server(0, NAMES, address=f"http://127.0.0.1:{fake.port}")
        server.healthy.set()
        watcher = monitor([server], [], failures=1)
        assert watcher.watches(server)
        fake.silent = True
        watcher.check(server)
        assert server.restarts == 0 and "plasmid does not restart servers it did not launch" in server.failure
        assert not monitor([server], [], watch_attached=False).watches(server)
    finally:
        fake.silent = False
        fake.stop()


def test_the_thread_wakes_at_once_when_asked_and_stops(launched):
    restored = []
    watcher = monitor([launched], restored, failures=1)
    watcher.start()
    try:
        launched.process.kill()
        watcher.wake()
        deadline = time.monotonic() + 30
        while not (launched.restarts and launched.healthy.is_set()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert launched.restarts == 1 and len(restored) == 1
    finally:
        watcher.stop()
    assert not watcher._thread.is_alive()
