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

import pytest

LOGPROB_BOUND = 1e-5
#: the teacher server's access-log line of a request (``score`` makes one per sample)
REQUEST_LINE = "POST /generate "


@pytest.mark.timeout(300)
def test_an_sglang_server_serves_the_opd_teacher_of_a_torchgen_student(engines, tiny_llama, tmp_path):
    pytest.importorskip("plasmid_opd")
    import plasmid_torchgen.plugin
    from plasmid_opd.teacher_check import check_served_teacher

    teacher = engines[0].servers[0]
    check = check_served_teacher("sglang", teacher.url, teacher.process.log_path, REQUEST_LINE, tiny_llama,
                                 tmp_path, plasmid_torchgen.plugin)
    check.assert_served("SGLang", LOGPROB_BOUND)
