"""plasmid-opd: on-policy distillation (``--loss opd``, Agarwal et al. 2024; Thinking Machines 2025).

The student (the policy) samples; a teacher model scores the student's own tokens; each token's
advantage is the negative reverse KL to the teacher, ``log p_teacher(t) - log p_student(t)``, so
the policy gradient lowers ``KL(student || teacher)`` on the states the student visits. Two pieces:

- ``--generate opd`` (:class:`plasmid_opd.generate.OPDGenerate`; the default with ``--loss opd``):
  the single-turn generation, then ``score`` of the teacher engine (the
  :class:`plasmid.protocols.RolloutEngine` method every engine has, so torchgen, SGLang and vLLM
  teachers all work) on each finished sample: ``metadata["teacher_logprobs"]``. The teacher is
  ``--teacher-model DIR`` served by an engine of kind ``--teacher-engine`` (default: the run's
  ``--engine``), built in the process that generates; it never attaches to the student's servers
  (``--<engine>-external-addrs`` are not passed on; ``--teacher-external-addrs`` gives its own).
  It must share the student's tokenizer;
- ``--loss opd`` (:class:`plasmid_opd.loss.OPDLoss`): the shared clipped policy loss
  (:class:`plasmid_torch.policy_gradient.PolicyGradientLoss`, with its TIS/MIS and mismatch
  metrics) with those advantages, plus ``--opd-reward-weight`` times GRPO's group-relative
  advantage of the task reward.
"""
