"""plasmid-grpo's own options (the shared ones are plasmid-torch's
:class:`plasmid_torch.loss_options.PolicyGradientOptions`)."""

from __future__ import annotations

from typing import Literal

from plasmid.options import Options, option


class GRPOOptions(Options, group="grpo", description="the GRPO family (--loss grpo | dr-grpo | dapo | gspo | "
                                                     "cispo | rloo)"):
    disable_std_normalization: bool = option(False, "group-relative advantages are r - mean, not divided by the "
                                             "group's std (dr-grpo never divides)")
    turn_credit: Literal["none", "by-turn", "pooled"] = option(
        "none", "per-turn credit for multi-turn samples that carry per-turn rewards (gym, verifiers, an agent "
        "returning one reward per call): none = one "
        "advantage per sample from its reward; by-turn = each turn's tokens get the advantage of that turn's "
        "return (its reward plus the later turns', discounted by --turn-discount) against the same turn of the "
        "group's other samples; pooled = against all turns of the group. A sample without per-turn rewards is "
        "one turn")
    turn_discount: float = option(1.0, "discount per turn of the later turns' rewards in a turn's return "
                                  "(--turn-credit by-turn | pooled)", min=0.0, max=1.0)
