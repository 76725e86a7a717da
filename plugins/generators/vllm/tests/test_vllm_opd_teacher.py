"""``--loss opd`` with a vLLM teacher: ``plasmid train --engine torchgen --loss opd --teacher-engine vllm
--teacher-external-addrs URL``, the teacher being the session's vLLM server (``conftest.engine``), which
serves the same tiny model as the torchgen student starts from.

Two training steps; ``--save-rollouts`` keeps the teacher log-probs the loss read
(``metadata["teacher_logprobs"]``), which must equal torchgen's ``score`` of the same tokens. Both
compute in float32 (vLLM's oneDNN GEMMs, torchgen's own decoder), so they differ by the order of
float32 operations: measured max |difference| 4.8e-7 over the 2 steps' ~95 response tokens; the
bound is :data:`LOGPROB_BOUND`. The teacher is the student's starting point, so step 0's
``train/opd_reverse_kl`` is ~0 too (measured 9e-9). The test itself takes ~10 s on 2 CPU cores.
"""

from __future__ import annotations

import pytest

LOGPROB_BOUND = 1e-5
#: the teacher server's access-log line of a request (``score`` makes one per sample)
REQUEST_LINE = "POST /v1/completions "


@pytest.mark.timeout(300)
def test_a_vllm_server_serves_the_opd_teacher_of_a_torchgen_student(engine, tiny_qwen, tmp_path):
    pytest.importorskip("plasmid_opd")
    import plasmid_torchgen.plugin
    from plasmid_opd.teacher_check import check_served_teacher

    teacher = engine.servers[0]
    check = check_served_teacher("vllm", teacher.url, teacher.process.log_path, REQUEST_LINE, tiny_qwen, tmp_path,
                                 plasmid_torchgen.plugin)
    check.assert_served("vLLM", LOGPROB_BOUND)
