"""plasmid-grpo's own options (the shared ones are plasmid-torch's
:class:`plasmid_torch.loss_options.PolicyGradientOptions`)."""

from __future__ import annotations

from plasmid.options import Options, option


class GRPOOptions(Options, group="grpo", description="the GRPO family (--loss grpo | dr-grpo | dapo | gspo | "
                                                     "cispo | rloo)"):
    disable_std_normalization: bool = option(False, "group-relative advantages are r - mean, not divided by the "
                                             "group's std (dr-grpo never divides)")
