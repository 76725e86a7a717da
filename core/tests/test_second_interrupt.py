"""A second SIGINT ends the ``plasmid`` command within seconds even when what it unwinds hangs
(:func:`plasmid.shutdown.force_exit_after_second_interrupt`, set by the console script's entry)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent("""
    import asyncio, os, signal, sys, threading, time
    from plasmid import shutdown

    if sys.argv[1] == "forced":
        shutdown.force_exit_after_second_interrupt(1.0)
    # a worker stuck in a long call: interpreter exit joins non-daemon threads, so without the
    # forced exit the process would hang here for a minute after the KeyboardInterrupt
    threading.Thread(target=time.sleep, args=(60,)).start()

    async def run():
        with shutdown.StopSignals(asyncio.get_running_loop()):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(60)

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def test_a_second_sigint_ends_the_process_even_when_a_thread_holds_it():
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", SCRIPT, "forced"], capture_output=True, text=True, timeout=50)
    assert result.returncode == 130, result.stderr[-2000:]
    assert "interrupted" in result.stdout and "exiting now" in result.stderr
    assert time.monotonic() - started < 20


def test_without_it_the_stuck_thread_holds_the_process():
    with pytest.raises(subprocess.TimeoutExpired):         # what the forced exit is for
        subprocess.run([sys.executable, "-c", SCRIPT, "plain"], capture_output=True, text=True, timeout=8)


def test_the_console_script_arms_it(monkeypatch):
    from plasmid import shutdown
    from plasmid.app import cli

    monkeypatch.setattr(cli, "main", lambda: 0)
    monkeypatch.setattr(shutdown, "_force_exit_seconds", None)
    with pytest.raises(SystemExit):
        cli.entry()
    assert shutdown._force_exit_seconds == cli.FORCE_EXIT_SECONDS
