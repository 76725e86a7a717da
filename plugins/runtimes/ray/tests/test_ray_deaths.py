"""plasmid_ray.deaths.classify: every cause of an actor's death is one line of the right kind.

The first tests build Ray's exceptions the way Ray does (an ``ActorDiedErrorContext`` whose
message has the GCS's wording, as ``ray._private.serialization`` builds the error from it); the
last provokes each death for real on the module's local cluster.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

ray = pytest.importorskip("ray")
rex = pytest.importorskip("ray.exceptions")

from plasmid_ray import deaths  # noqa: E402
from plasmid_ray.deaths import classify  # noqa: E402
from ray.core.generated.common_pb2 import ActorDiedErrorContext  # noqa: E402

WORKER_DIED = "The actor is dead because its worker process has died. Worker exit type: "
EOF_DETAIL = ("SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of "
              "file. Some common causes include: (1) the process was killed by the OOM killer due to high memory "
              "usage, (2) ray stop --force was called, or (3) the worker crashed unexpectedly due to SIGSEGV or "
              "another unexpected error.")


def died(message: str) -> rex.ActorDiedError:
    """An ``ActorDiedError`` as Ray deserializes it from the GCS's death context."""
    context = ActorDiedErrorContext(error_message=message, class_name="TrainerWorker", actor_id=bytes(range(16)),
                                    pid=4242, node_ip_address="127.0.0.1")
    return rex.ActorDiedError(cause=context)


def one_line(text: str) -> bool:
    return "\n" not in text and 0 < len(text) <= 200


@pytest.mark.parametrize(("error", "kind", "words"), [
    (died(WORKER_DIED + EOF_DETAIL), "signal", "SIGKILL"),
    (died(WORKER_DIED + "SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly. Worker exits with an exit "
          "code 1. The process receives a SIGTERM."), "signal", "killed by SIGTERM"),
    (died(WORKER_DIED + "SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly. Worker exits with an exit "
          "code 3."), "exit", "exited with status 3"),
    (died(WORKER_DIED + "NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low on "
          "memory. Memory on the node was 7.5GB / 8GB (0.95), killing this task."), "oom",
     "out of memory: Ray's memory monitor killed it (Task was killed due to the node running low on memory)"),
    (rex.OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node ..."), "oom",
     "Ray's memory monitor"),
    (died("The actor died because its node has died. Node Id: 8b69fc20501ccf942e11251534b342319a00f555"), "node",
     "its node died (node 8b69fc20501c)"),
    (rex.NodeDiedError("The node with node id 8b69fc20 has died."), "node", "its node died"),
    (died("The actor is dead because it was killed by `ray.kill`."), "killed", "ray.kill"),
    (died("The actor is dead because its owner has died. Owner Id: 01000000 Owner Ip address: 127.0.0.1"), "owner",
     "owned it died"),
    (rex.ActorUnavailableError("connection lost", None), "unavailable", "unreachable"),
    (rex.ActorDiedError.from_task_error(rex.RayTaskError(
        "__init__", 'Traceback (most recent call last):\n  File "x.py", line 1, in __init__\nValueError: no model',
        ValueError("no model"))), "exception", "crashed with an exception: ValueError: no model"),
    (rex.ActorDiedError(), "unknown", "The actor died unexpectedly"),
])
def test_each_cause_is_one_line_of_its_kind(error, kind, words):
    death = classify(error)
    assert death.kind == kind, death
    assert words in death.cause, death
    assert one_line(death.cause), death.cause


def test_a_silent_death_while_the_kernel_counted_an_oom_kill_is_out_of_memory():
    death = classify(died(WORKER_DIED + EOF_DETAIL), kernel_oom_kills=1)
    assert death.kind == "oom" and "kernel's OOM killer counted 1 kill(s)" in death.cause, death
    # the count only speaks for deaths Ray could not explain
    assert classify(died("The actor is dead because it was killed by `ray.kill`."), kernel_oom_kills=1).kind == "killed"


@pytest.mark.parametrize(("name", "text"), [("memory.events", "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n"),
                                            ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")])
def test_oom_kills_reads_the_cgroup_v2_and_v1_counters(tmp_path, monkeypatch, name, text):
    counter = tmp_path / name
    counter.write_text(text)
    monkeypatch.setattr(deaths, "OOM_COUNTERS", (tmp_path / "absent", counter))
    assert deaths.oom_kills() == 2
    assert deaths.oom_kills_since(1) == 1 and deaths.oom_kills_since(None) == 0
    counter.write_text("oom_kill_disable 0\n")
    assert deaths.oom_kills() is None and deaths.oom_kills_since(0) == 0


class Doomed:
    """An actor that dies on request, each way a process can."""

    def __init__(self, fail: bool = False) -> None:
        if fail:
            raise ValueError("no model at /nowhere")

    def pid(self) -> int:
        return os.getpid()

    def sleep(self) -> None:
        time.sleep(120)

    def exit(self, status: int) -> None:
        sys.exit(status)  # Ray's worker turns SystemExit into an exit with that status


@pytest.mark.timeout(180)
def test_real_deaths_are_told_apart(ray_cluster):
    actor = ray_cluster.remote(max_restarts=0, num_cpus=0)(Doomed)

    def death_of(kill) -> deaths.Death:
        handle = actor.remote()
        pid = ray_cluster.get(handle.pid.remote())
        pending = handle.sleep.remote()
        time.sleep(0.3)
        kill(handle, pid)
        with pytest.raises(rex.RayActorError) as caught:
            ray_cluster.get(pending, timeout=60)
        return classify(caught.value)

    assert death_of(lambda _, pid: os.kill(pid, signal.SIGKILL)).kind == "signal"
    sigterm = death_of(lambda _, pid: os.kill(pid, signal.SIGTERM))
    assert (sigterm.kind, sigterm.cause) == ("signal", "killed by SIGTERM")
    assert death_of(lambda handle, _: ray_cluster.kill(handle)).kind == "killed"

    exiting = actor.remote()
    with pytest.raises(rex.RayActorError) as caught:
        ray_cluster.get(exiting.exit.remote(3), timeout=60)
    assert classify(caught.value) == deaths.Death("exit", "its process exited with status 3")

    broken = actor.remote(True)
    with pytest.raises(rex.RayActorError) as caught:
        ray_cluster.get(broken.pid.remote(), timeout=60)
    assert classify(caught.value) == deaths.Death("exception", "crashed with an exception: ValueError: no model at "
                                                               "/nowhere")
