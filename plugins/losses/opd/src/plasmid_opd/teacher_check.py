"""Test support shipped with plasmid-opd: check that a running engine server serves the OPD teacher.

:func:`check_served_teacher` runs ``plasmid train --engine torchgen --loss opd --teacher-engine ENGINE
--teacher-external-addrs URL`` for a few steps, the teacher being a server of the same model the
torchgen student starts from, and measures what an engine's test asserts:

- the teacher log-probs the loss read (kept by ``--save-rollouts`` as ``metadata["teacher_logprobs"]``)
  against torchgen's ``score`` of the same tokens (max absolute difference);
- step 0's ``train/opd_reverse_kl`` (~0: the student starts as the teacher);
- how many requests the server logged during the run (a teacher quietly served by torchgen would give
  the same numbers, so the server's own log is the proof it scored).

:meth:`TeacherCheck.assert_served` asserts them.

Used by plasmid-vllm's and plasmid-sglang's tests, each in its own environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class TeacherCheck:
    """What one :func:`check_served_teacher` run measured."""

    #: max |teacher log-prob - torchgen score| over every response token of the run
    logprob_diff: float
    #: response tokens compared
    tokens: int
    #: ``train/opd_reverse_kl`` of step 0
    reverse_kl: float
    #: samples with a response (each is one ``score`` call of the teacher)
    samples: int
    #: requests the server logged during the run
    requests: int

    def assert_served(self, label: str, bound: float) -> None:
        """Print the figures, then assert what an engine's teacher test holds: the server logged a
        request per sample at least, and the teacher log-probs (against torchgen's score) and step
        0's reverse KL (the student starts as the teacher) are within ``bound``. ``label`` names
        the engine in the messages ("vLLM")."""
        print(f"{label} teacher vs torchgen score: max |diff| {self.logprob_diff:.2e} over {self.tokens} tokens; "
              f"step 0 opd_reverse_kl {self.reverse_kl:.2e}; {self.requests} requests served")
        assert self.requests >= self.samples, (f"the teacher server logged {self.requests} requests for "
                                               f"{self.samples} samples")
        assert self.logprob_diff <= bound, (f"the {label} teacher's log-probs differ from torchgen's score by "
                                            f"{self.logprob_diff:.2e}")
        assert abs(self.reverse_kl) <= bound, (f"step 0: the student is the teacher, yet opd_reverse_kl "
                                               f"{self.reverse_kl}")


def check_served_teacher(engine: str, url: str, server_log: Path, request_line: str, model: Path,
                         work: Path, torchgen_plugin: Any, steps: int = 2) -> TeacherCheck:
    """Train ``steps`` steps of OPD on the ``digitsum`` task with the teacher on the ``engine``
    server at ``url`` (serving ``model``), then compare (see the module docs).

    :param server_log: the server's log file; ``request_line`` is the text of one logged request.
    :param work: an empty scratch directory (run directory, saved rollouts, torchgen's run dir).
    :param torchgen_plugin: plasmid-torchgen's plugin module (``plasmid_torchgen.plugin``), whose
        engine's ``score`` is the reference; the caller passes it, since a plugin's own modules never
        import another plugin's.
    :raises AssertionError: the run failed (with its stderr's tail) or ran no response.
    """
    from plasmid.app.rollout_store import RolloutStore
    from plasmid.testing import build, make_config, run

    run_dir, saved = work / "run", work / "rollouts"
    served_before = server_log.read_text(errors="replace").count(request_line)
    command = [sys.executable, "-m", "plasmid.app.cli", "train", "--engine", "torchgen", "--model", str(model),
               "--loss", "opd", "--teacher-model", str(model), "--teacher-engine", engine,
               "--teacher-external-addrs", url, "--task", "digitsum", "--task-length", "1",
               "--task-eval-size", "2", "--prompts-per-step", "4", "--n-samples-per-prompt", "2",
               "--max-new-tokens", "8", "--num-rollouts", str(steps), "--eval-interval", "0", "--save-interval", "0",
               "--save-rollouts", str(saved), "--run-dir", str(run_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    requests = server_log.read_text(errors="replace").count(request_line) - served_before
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics] == list(range(steps))
    samples = [sample for step in range(steps) for group in RolloutStore(saved).load(step).groups
               for sample in group.samples if sample.response_length > 0]
    assert samples, "no sample had a response to score"

    config = make_config(torchgen_plugin, run_dir=work / "torchgen", model=str(model))
    torchgen = build("engine", "torchgen", torchgen_plugin, config=config)

    async def score_all() -> list[list[float]]:
        try:
            return list(await asyncio.gather(*(torchgen.score(list(s.tokens), s.prompt_length, 1.0)
                                               for s in samples)))
        finally:
            await torchgen.shutdown()

    expected = run(score_all())
    diff = max(float(np.max(np.abs(np.subtract(s.metadata["teacher_logprobs"], want))))
               for s, want in zip(samples, expected, strict=True))
    return TeacherCheck(logprob_diff=diff, tokens=sum(map(len, expected)),
                        reverse_kl=float(metrics[0]["train/opd_reverse_kl"]), samples=len(samples),
                        requests=requests)
