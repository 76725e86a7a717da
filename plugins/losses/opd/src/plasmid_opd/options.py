"""plasmid-opd's own options (the shared ones are plasmid-torch's
:class:`plasmid_torch.loss_options.PolicyGradientOptions`)."""

from __future__ import annotations

from plasmid.options import Options, option


class OPDOptions(Options, group="opd", description="on-policy distillation (--loss opd, --generate opd)"):
    teacher_model: str | None = option(None, "the teacher: a local Hugging Face model directory with the student's "
                                       "tokenizer, served by a --teacher-engine engine",
                                       default_text="none; --loss opd needs it")
    teacher_engine: str | None = option(None, "the rollout engine serving the teacher (any registered --engine; "
                                        "only its score method is used)", metavar="NAME",
                                        default_text="the run's --engine")
    teacher_external_addrs: str | None = option(
        None, "attach the teacher engine to these running servers of --teacher-model (its own "
        "--<engine>-external-addrs; the student's are never passed on); without it the teacher engine starts its own",
        metavar="HOST:PORT,...")
    opd_reward_weight: float = option(0.0, "add this times the task reward's group-relative (GRPO) advantage to "
                                      "the distillation advantage (0: distillation alone)", min=0)
