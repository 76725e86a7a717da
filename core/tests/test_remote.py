"""run_on calls a function on a provider, locally or through a proxy's plasmid_call."""

import asyncio

from plasmid.remote import is_remote, run_on


class Local:
    value = 3


class Proxy:
    """Test support: a proxy that 'runs remotely' by calling on a wrapped object."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    async def plasmid_call(self, fn, *args):
        self.calls += 1
        return await run_on(self.inner, fn, *args)


def times(target, factor):
    return target.value * factor


async def async_times(target, factor):
    return target.value * factor


def test_run_on_a_local_object_calls_directly_and_awaits_coroutines():
    assert asyncio.run(run_on(Local(), times, 2)) == 6
    assert asyncio.run(run_on(Local(), async_times, 3)) == 9
    assert not is_remote(Local())


def test_run_on_a_proxy_goes_through_plasmid_call():
    proxy = Proxy(Local())
    assert asyncio.run(run_on(proxy, times, 5)) == 15 and proxy.calls == 1 and is_remote(proxy)
