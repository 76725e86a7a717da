"""plasmid-grpo: Group Relative Policy Optimization as a plasmid loss (``--loss grpo``).

Advantages are each response's reward relative to the other responses to the same prompt;
the loss is PPO's clipped surrogate, plus optional KL (as a loss term or a reward penalty) and
entropy terms. :class:`plasmid_grpo.loss.GRPOLoss` is built to be subclassed by GRPO variants.
"""
