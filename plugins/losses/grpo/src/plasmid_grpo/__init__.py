"""plasmid-grpo: the GRPO family of losses (``--loss grpo | dr-grpo | dapo | gspo | cispo | rloo``).

Advantages are each response's reward relative to the other responses to the same prompt;
the loss is PPO's clipped surrogate (or a variant of it), plus optional KL (as a loss term or a
reward penalty), entropy and rollout-correction terms. The shared base (also of plasmid-ppo and
plasmid-reinforce-pp) is plasmid-torch's :class:`plasmid_torch.policy_gradient.PolicyGradientLoss`;
:class:`plasmid_grpo.loss.GRPOLoss` is GRPO, and :mod:`plasmid_grpo.variants` holds the variants,
each a small subclass.
"""
