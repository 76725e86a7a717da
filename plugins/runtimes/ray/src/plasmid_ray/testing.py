"""Test support for code that runs under the Ray runtime: a local Ray cluster for a test module.

``local_cluster(cpus)`` starts Ray the way this machine's tests need it: its session directory
under a short path in /tmp (Ray's unix sockets live there and their paths must stay under ~107
characters), no usage stats, no uv runtime environments, no auth, and one math thread per actor.
A run started inside it (``plasmid.app.run.run_training``) uses this session and leaves it running.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Environment Ray reads when it starts (set for the cluster's lifetime, then restored).
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}


@contextmanager
def local_cluster(cpus: int) -> Iterator[Any]:
    """A local Ray cluster with ``cpus`` logical CPUs (actors reserve logical CPUs, so this may
    exceed the machine's cores); yields the ``ray`` module and shuts the cluster down after."""
    import ray

    from plasmid_ray.cluster import ACTOR_ENV

    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)
    temp_dir = tempfile.mkdtemp(prefix="plasmid-ray-", dir="/tmp")
    ray.init(num_cpus=cpus, include_dashboard=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": dict(ACTOR_ENV)}, log_to_driver=True)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
