"""plasmid_serving.pool: the choice of a server, suspect and failed servers, waiting for one."""

from __future__ import annotations

import asyncio
import threading

import pytest
from serving_fakes import NAMES

from plasmid.errors import ProviderError
from plasmid_serving.pool import Server, ServerPool


def servers(count: int) -> list[Server]:
    made = [Server(index, NAMES, address=f"http://127.0.0.1:{9000 + index}") for index in range(count)]
    for server in made:
        server.healthy.set()
    return made


def test_requests_go_to_the_least_loaded_healthy_server_ties_to_the_first():
    pool = ServerPool(servers(3), max_concurrency=4)
    assert pool.choose().index == 0
    pool.servers[0].in_flight = 2
    pool.servers[1].in_flight = 1
    pool.servers[2].in_flight = 1
    assert pool.choose().index == 1
    pool.servers[1].mark_suspect()
    assert pool.choose().index == 2 and pool.servers[1].suspect_since is not None


def test_suspect_servers_are_chosen_when_none_is_healthy_and_failed_ones_never():
    pool = ServerPool(servers(2), max_concurrency=4)
    pool.servers[0].failure = "the restart failed"
    pool.servers[1].mark_suspect()
    assert pool.choose().index == 1 and pool.usable() == [pool.servers[1]]
    pool.servers[1].failure = "it was restarted 3 times already"
    with pytest.raises(ProviderError, match=r"Fake server 0 \(http://127.0.0.1:9000, attached\) is out of service: "
                                            r"the restart failed"):
        pool.choose()


def test_wait_usable_returns_once_another_thread_finds_the_server_healthy():
    pool = ServerPool(servers(1), max_concurrency=4)
    server = pool.servers[0]
    server.mark_suspect()
    timer = threading.Timer(0.2, server.healthy.set)
    timer.start()
    try:
        asyncio.run(asyncio.wait_for(pool.wait_usable(server, timeout=60), timeout=60))
    finally:
        timer.cancel()
    assert server.healthy.is_set()


def test_wait_usable_gives_up_when_the_server_is_put_out_of_service_or_time_is_up():
    pool = ServerPool(servers(1), max_concurrency=4)
    server = pool.servers[0]
    server.mark_suspect()
    with pytest.raises(ProviderError, match="did not come back within 0 s"):
        asyncio.run(pool.wait_usable(server, timeout=0.1))
    server.failure = "its restart failed"
    with pytest.raises(ProviderError, match="out of service: its restart failed"):
        asyncio.run(pool.wait_usable(server, timeout=60))


def test_admission_admits_max_concurrency_at_once_and_is_made_again_on_a_new_event_loop():
    pool = ServerPool(servers(1), max_concurrency=2)
    server = pool.servers[0]

    async def count_admitted() -> int:
        admission = pool.admission(server)
        assert pool.admission(server) is admission and pool.update_lock(server) is pool.update_lock(server)
        peak = running = 0

        async def one() -> None:
            nonlocal peak, running
            async with admission:
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.01)
                running -= 1

        await asyncio.gather(*(one() for _ in range(6)))
        return peak

    assert asyncio.run(count_admitted()) == 2
    assert asyncio.run(count_admitted()) == 2   # a semaphore of a closed loop would fail here
