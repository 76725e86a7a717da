"""plasmid-opd's own options (the shared ones are plasmid-torch's
:class:`plasmid_torch.loss_options.PolicyGradientOptions`)."""

from __future__ import annotations

from plasmid.options import Options, option


class OPDOptions(Options, group="opd", description="on-policy distillation (--loss opd, --generate opd)"):
    teacher_model: str | None = option(None, "the teacher: a local Hugging Face model directory with the student's "
                                       "tokenizer, served by an engine of the run's --engine kind",
                                       default_text="none; --loss opd needs it")
    opd_reward_weight: float = option(0.0, "add this times the task reward's group-relative (GRPO) advantage to "
                                      "the distillation advantage (0: distillation alone)", min=0)
