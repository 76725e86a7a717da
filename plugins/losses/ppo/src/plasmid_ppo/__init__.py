"""plasmid-ppo: Proximal Policy Optimization with a learned critic (``--loss ppo``).

Per-token rewards (the KL penalty on every token, the scalar reward on the last), advantages
by GAE against the critic's values, the clipped policy loss shared with the GRPO family
(:class:`plasmid_torch.policy_gradient.PolicyGradientLoss`), and a clipped value loss that the trainer
uses to train its critic (:class:`plasmid.protocols.CriticLoss`).
"""
