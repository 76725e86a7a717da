"""``--loss opd`` with an SGLang teacher: ``plasmid train --engine torchgen --loss opd --teacher-engine sglang
--teacher-external-addrs URL``, the teacher being the first of the session's SGLang servers
(``conftest.engines``, the CPU stand-in for ``sgl_kernel`` on a machine without a GPU), which serves
the same tiny Llama as the torchgen student starts from.

Two training steps; ``--save-rollouts`` keeps the teacher log-probs the loss read
(``metadata["teacher_logprobs"]``), which must equal torchgen's ``score`` of the same tokens. Both
compute in float32 (plasmid serves a float32 checkpoint in float32), so they differ by the order of
float32 operations: measured max |difference| 4.8e-7 over the 2 steps' ~99 response tokens; the
bound is :data:`LOGPROB_BOUND`. The teacher is the student's starting point, so step 0's
``train/opd_reverse_kl`` is ~0 too (measured 2e-8). The test itself takes ~8 s on 2 CPU cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import numpy as np
import pytest

LOGPROB_BOUND = 1e-5
STEPS = 2
#: the teacher server's access-log line of a request (``score`` makes one per sample)
REQUEST_LINE = "POST /generate "


def requests_served(server) -> int:
    """How many requests the SGLang server has logged (uvicorn's access log, flushed per line)."""
    return server.process.log_path.read_text(errors="replace").count(REQUEST_LINE)


@pytest.mark.timeout(300)
def test_an_sglang_server_serves_the_opd_teacher_of_a_torchgen_student(engines, tiny_llama, tmp_path):
    pytest.importorskip("plasmid_opd")
    import plasmid_torchgen.plugin

    from plasmid.rollout_store import RolloutStore
    from plasmid.testing import build, make_config, run

    run_dir, saved = tmp_path / "run", tmp_path / "rollouts"
    teacher = engines[0].servers[0]
    served_before = requests_served(teacher)
    command = [sys.executable, "-m", "plasmid.cli", "train", "--engine", "torchgen", "--model", str(tiny_llama),
               "--loss", "opd", "--teacher-model", str(tiny_llama), "--teacher-engine", "sglang",
               "--teacher-external-addrs", teacher.url, "--task", "digitsum", "--task-length", "1",
               "--task-eval-size", "2", "--prompts-per-step", "4", "--n-samples-per-prompt", "2",
               "--max-new-tokens", "8", "--num-rollouts", str(STEPS), "--eval-interval", "0", "--save-interval", "0",
               "--save-rollouts", str(saved), "--run-dir", str(run_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [m["step"] for m in metrics] == list(range(STEPS))

    samples = [sample for step in range(STEPS) for group in RolloutStore(saved).load(step).groups
               for sample in group.samples if sample.response_length > 0]
    assert samples, "no sample had a response to score"
    # the SGLang server scored them (a torchgen teacher on the same model would give the same numbers)
    served = requests_served(teacher) - served_before
    assert served >= len(samples), f"the teacher server logged {served} requests for {len(samples)} samples"
    config = make_config(plasmid_torchgen.plugin, run_dir=tmp_path / "torchgen", model=str(tiny_llama))
    torchgen = build("engine", "torchgen", plasmid_torchgen.plugin, config=config)

    async def score_all():
        try:
            return await asyncio.gather(*(torchgen.score(list(s.tokens), s.prompt_length, 1.0) for s in samples))
        finally:
            await torchgen.shutdown()

    expected = run(score_all())
    diff = max(float(np.max(np.abs(np.subtract(s.metadata["teacher_logprobs"], want))))
               for s, want in zip(samples, expected, strict=True))
    reverse_kl = metrics[0]["train/opd_reverse_kl"]
    print(f"SGLang teacher vs torchgen score: max |diff| {diff:.2e} over {sum(map(len, expected))} tokens; "
          f"step 0 opd_reverse_kl {reverse_kl:.2e}")
    assert diff <= LOGPROB_BOUND, f"the SGLang teacher's log-probs differ from torchgen's score by {diff:.2e}"
    assert abs(reverse_kl) <= LOGPROB_BOUND, f"step 0: the student is the teacher, yet opd_reverse_kl {reverse_kl}"
