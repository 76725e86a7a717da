"""TEST SUPPORT: run a worker script as the ranks of one torch.distributed world on this machine.

``run_ranks(worker, settings, world_size)`` starts ``python worker '<json settings>'`` once per rank
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set; none of them for a
world of one), one math thread each, waits for all, fails with a rank's output if one fails, and
returns the JSON that rank 0 wrote to ``<settings["out"]>/result.json``. Workers end with
:func:`leave_world`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

#: seconds a rank may take before the whole world is killed
RANK_TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def leave_world() -> None:
    """Called by a worker as its last step: wait for every rank, then tear the process group down.

    A rank that exits while another still talks to the store rank 0 hosts, or with gloo's threads
    alive, can die in C++ ("terminate called without an active exception") after its work is done.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_ranks(worker: Path, settings: dict, world_size: int) -> dict:
    out = Path(settings["out"])
    out.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(settings)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    if world_size > 1:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
    processes = [subprocess.Popen([sys.executable, str(worker), payload], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)} if world_size > 1 else env)
                 for rank in range(world_size)]
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=RANK_TIMEOUT)[0])
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank} of {settings} failed:\n{output[-4000:]}"
    return json.loads((out / "result.json").read_text())
