"""plasmid-reinforce-pp: REINFORCE++ (Hu et al. 2025) without a critic
(``--loss reinforce++ | reinforce++-baseline``).

Advantages are discounted per-token returns, whitened across the whole batch; the policy loss
is the clipped loss shared with the GRPO family (:class:`plasmid_torch.policy_gradient.PolicyGradientLoss`).
"""
